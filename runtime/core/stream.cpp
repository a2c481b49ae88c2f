// Stream and event wrappers; CUDA work is delegated to the backend.
#include "runtime/core/stream.h"

#include "runtime/core/graph.h"

namespace fanout {

Stream::Stream(Device d) : device_(d) {
  if (d.is_cuda()) handle_ = backend::stream_create(d.index);
}
Stream::~Stream() {
  if (handle_) backend::stream_destroy(device_.index, handle_);
}
void Stream::synchronize() const {
  forbid_in_capture("a stream synchronization");
  if (handle_) backend::stream_sync(device_.index, handle_);
}

Event::Event(Device d) : device_(d) {
  if (d.is_cuda()) handle_ = backend::event_create(d.index);
}
Event::~Event() {
  if (handle_) backend::event_destroy(device_.index, handle_);
}
void Event::record(const Stream& s) {
  if (handle_) backend::event_record(device_.index, handle_, s.handle());
}
void Event::wait(const Stream& s) const {
  if (handle_) backend::event_wait(s.device().index, handle_, s.handle());
}
void Event::synchronize() const {
  forbid_in_capture("an event synchronization");
  if (handle_) backend::event_sync(device_.index, handle_);
}

}  // namespace fanout
