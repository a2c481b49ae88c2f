// CUDA graphs for training steps.
#include "runtime/parallel/step_graph.h"

#include <cstdio>
#include <cstring>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/core/memory.h"

namespace fanout {

CudaGraphs parse_cuda_graphs(const std::string& s) {
  if (s == "auto") return CudaGraphs::Auto;
  if (s == "off") return CudaGraphs::Off;
  throw Error("--cuda-graphs takes auto or off, not '" + s + "'");
}

const char* cuda_graphs_name(CudaGraphs g) { return g == CudaGraphs::Auto ? "auto" : "off"; }

StepGraphPolicy::StepGraphPolicy(bool on, std::string why) {
  stats_.on = on;
  if (!on) stats_.off_reason = std::move(why);
}

StepGraphPolicy::Action StepGraphPolicy::train_step(const std::string& key, bool* drop) {
  *drop = false;
  if (!stats_.on) {
    ++stats_.plain;
    return Action::Plain;
  }
  if (has_graph() && key == graph_key_) {
    ++stats_.replays;
    return Action::Replay;
  }
  if (has_graph()) {
    *drop = true;
    graph_key_.clear();
  }
  if (key == warm_key_) {
    warm_key_.clear();
    graph_key_ = key;  // kept if the capture succeeds
    return Action::Capture;
  }
  warm_key_ = key;
  ++stats_.plain;
  return Action::Plain;
}

bool StepGraphPolicy::other_pass() {
  const bool had = has_graph();
  graph_key_.clear();
  warm_key_.clear();
  return had;
}

void StepGraphPolicy::captured(bool ok, const std::string& why) {
  if (ok) {
    ++stats_.captures;
    return;
  }
  graph_key_.clear();
  ++stats_.plain;  // the step then runs plain
  turn_off(why);
}

void StepGraphPolicy::turn_off(const std::string& why) {
  stats_.on = false;
  stats_.off_reason = why;
  graph_key_.clear();
  warm_key_.clear();
}

StepGraphs::StepGraphs(CudaGraphs mode, Device device)
    : policy_(mode == CudaGraphs::Auto && device.is_cuda(),
              mode == CudaGraphs::Off ? "--cuda-graphs off" : "CPU devices have no CUDA graphs") {}

void StepGraphs::fall_back(const std::string& why) {
  std::fprintf(stderr, "fanout: CUDA graphs off: %s; training steps run with plain launches\n", why.c_str());
}

void StepGraphs::other_pass() {
  if (policy_.other_pass()) graph_.reset();
}

namespace {
// What may have moved or rewritten a buffer a graph points at, since a mark.
uint64_t moves() { return thread_device_allocs() + device_state_rewrites(); }
}  // namespace

void StepGraphs::train_step(Context& ctx, const std::string& key, const std::function<void()>& work) {
  // An allocation on this thread since the last graph step may have moved a
  // buffer the graph points at (a pass outside the engine, a layer grown),
  // and kept state may have been rewritten: warm up again.
  const uint64_t before = moves();
  if (policy_.has_graph() && before != allocs_) other_pass();
  bool drop = false;
  const StepGraphPolicy::Action a = policy_.train_step(key, &drop);
  if (drop) graph_.reset();
  if (a == StepGraphPolicy::Action::Replay) {
    graph_.launch(ctx.compute());
    for (auto& fn : effects_) fn();
    return;
  }
  if (a == StepGraphPolicy::Action::Plain) {
    const uint64_t draws = ctx.random_draws;
    work();
    if (ctx.random_draws != draws && policy_.stats().on) {
      policy_.turn_off("the model draws random numbers in training (Dropout), which a replayed graph would repeat");
      fall_back(policy_.stats().off_reason);
    }
    allocs_ = moves();
    return;
  }
  // Capture: nothing queued inside runs until the graph is launched. Every
  // failure leaves the stream out of capture, the effects unset, the policy
  // off, and the step run plainly.
  effects_.clear();
  const uint64_t draws = ctx.random_draws;
  std::string why;
  bool ok = false;
  try {
    graph_.begin(ctx.compute());
    ctx.captured_effects = &effects_;
    work();
    ctx.captured_effects = nullptr;
    ok = graph_.end(&why);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {
    why = "an unknown exception";
  }
  ctx.captured_effects = nullptr;
  graph_.abandon();  // no-op unless the capture is still open
  if (ok && ctx.random_draws != draws) {
    ok = false;
    why = "the model draws random numbers in training (Dropout), which a replayed graph would repeat";
  } else if (ok && moves() != before) {
    ok = false;
    why = "the step allocated device memory (or rewrote kept state) while it was captured";
  }
  policy_.captured(ok, why);
  if (ok) {
    graph_.launch(ctx.compute());
    for (auto& fn : effects_) fn();
    allocs_ = moves();
    return;
  }
  graph_.reset();
  effects_.clear();
  fall_back("capturing a training step failed: " + why);
  work();  // the step itself, plainly
  allocs_ = moves();
}

std::string step_graph_key(const Tensor& x, const Tensor& y, float grad_scale, const std::vector<const void*>& arenas) {
  std::ostringstream k;
  k << x.shape().str() << dtype_name(x.dtype()) << '|' << y.shape().str() << dtype_name(y.dtype()) << '|';
  uint32_t bits = 0;
  std::memcpy(&bits, &grad_scale, sizeof bits);
  k << std::hex << bits;
  for (const void* p : arenas) k << '|' << p;
  return k.str();
}

}  // namespace fanout
