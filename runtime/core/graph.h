// A CUDA graph captured from the work one thread queues on one stream, then
// replayed on that stream with the same device addresses. While a capture
// is open, other threads' allocations, frees and copies wait for it (they
// hold detail::capture_guard shared; the capturing thread holds it
// exclusively), so nothing outside joins or breaks the capture. CPU devices
// have no graphs: begin() on one is an error.
#pragma once
#include <string>

#include "runtime/core/stream.h"

namespace fanout {

class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;

  // Starts capturing what this thread queues on s (nothing runs until launch).
  void begin(Stream& s);
  // Ends the capture and instantiates the graph: true when it can be
  // launched; false with the reason when the capture broke (a call the
  // capture forbids, such as a host synchronization). Either way the stream
  // is out of capture mode and nothing captured has run.
  bool end(std::string* why);
  // Ends a capture after an error thrown inside it; the graph is dropped.
  void abandon() noexcept;
  bool capturing() const { return stream_ != nullptr; }
  bool ready() const { return exec_ != nullptr; }
  // Queues the whole graph on s.
  void launch(Stream& s);
  void reset() noexcept;

 private:
  Stream* stream_ = nullptr;  // while capturing
  void* exec_ = nullptr;      // cudaGraphExec_t
  int device_ = -1;
};

namespace backend {
void graph_capture_begin(int device, void* stream);
// The instantiated graph, or null with *why set.
void* graph_capture_end(int device, void* stream, std::string* why);
void graph_launch(int device, void* exec, void* stream);
void graph_destroy(int device, void* exec) noexcept;
}  // namespace backend

}  // namespace fanout
