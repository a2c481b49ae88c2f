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

// While this thread captures a step (StreamGraph::begin to end), or inside
// a CaptureCheck scope on any device (tests run a step so on CPU devices),
// what a capture forbids throws at once and says what it was: a host
// synchronization (Stream or Event), an allocation.
bool capture_checked();
void forbid_in_capture(const char* what);
class CaptureCheck {
 public:
  CaptureCheck();
  ~CaptureCheck();
  CaptureCheck(const CaptureCheck&) = delete;
  CaptureCheck& operator=(const CaptureCheck&) = delete;

 private:
  bool prev_;
};

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
  bool checked_prev_ = false;
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
