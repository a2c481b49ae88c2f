// RAII stream and event. On CPU devices work runs inline on the calling
// worker thread, so a CPU stream is a no-op and its events are always complete.
#pragma once
#include "runtime/core/device.h"

namespace fanout {

class Stream {
 public:
  explicit Stream(Device d);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Device device() const { return device_; }
  void* handle() const { return handle_; }  // cudaStream_t, or null on CPU
  void synchronize() const;
 private:
  Device device_;
  void* handle_ = nullptr;
};

class Event {
 public:
  explicit Event(Device d);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& s);
  void wait(const Stream& s) const;  // makes s wait for this event
  void synchronize() const;
 private:
  Device device_;
  void* handle_ = nullptr;
};

namespace backend {
void* stream_create(int device);
void stream_destroy(int device, void* s) noexcept;
void stream_sync(int device, void* s);
void* event_create(int device);
void event_destroy(int device, void* e) noexcept;
void event_record(int device, void* e, void* s);
void event_wait(int device, void* e, void* s);
void event_sync(int device, void* e);
}  // namespace backend

}  // namespace fanout
