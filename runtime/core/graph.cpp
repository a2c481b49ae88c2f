// StreamGraph over the backend's capture calls.
#include "runtime/core/graph.h"

#include "runtime/core/error.h"

namespace fanout {

namespace {
thread_local bool t_checked = false;
}

bool capture_checked() { return t_checked; }
void forbid_in_capture(const char* what) {
  if (t_checked) FANOUT_FAIL() << what << " inside a captured training step (CUDA graphs forbid it)";
}
CaptureCheck::CaptureCheck() : prev_(t_checked) { t_checked = true; }
CaptureCheck::~CaptureCheck() { t_checked = prev_; }

StreamGraph::~StreamGraph() {
  abandon();
  reset();
}

void StreamGraph::begin(Stream& s) {
  FANOUT_CHECK(!stream_) << "a graph capture is already open";
  FANOUT_CHECK(s.device().is_cuda()) << "CUDA graphs need a CUDA stream, not " << s.device().str();
  reset();
  backend::graph_capture_begin(s.device().index, s.handle());
  stream_ = &s;
  device_ = s.device().index;
  checked_prev_ = t_checked;
  t_checked = true;
}

bool StreamGraph::end(std::string* why) {
  FANOUT_CHECK(stream_) << "no graph capture is open";
  Stream* s = stream_;
  stream_ = nullptr;
  t_checked = checked_prev_;
  exec_ = backend::graph_capture_end(device_, s->handle(), why);
  return exec_ != nullptr;
}

void StreamGraph::abandon() noexcept {
  if (!stream_) return;
  Stream* s = stream_;
  stream_ = nullptr;
  t_checked = checked_prev_;
  std::string ignored;
  try {
    exec_ = backend::graph_capture_end(device_, s->handle(), &ignored);
  } catch (...) {
    exec_ = nullptr;
  }
  reset();
}

void StreamGraph::launch(Stream& s) {
  FANOUT_CHECK(exec_) << "no graph to launch";
  FANOUT_CHECK(s.device().is_cuda() && s.device().index == device_) << "a graph launched on another device";
  backend::graph_launch(device_, exec_, s.handle());
}

void StreamGraph::reset() noexcept {
  if (exec_) backend::graph_destroy(device_, exec_);
  exec_ = nullptr;
}

}  // namespace fanout
