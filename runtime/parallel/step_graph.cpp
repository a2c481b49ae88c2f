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
  if (s == "check") return CudaGraphs::Check;
  throw Error("--cuda-graphs takes auto, off or check, not '" + s + "'");
}

const char* cuda_graphs_name(CudaGraphs g) {
  return g == CudaGraphs::Auto ? "auto" : g == CudaGraphs::Off ? "off" : "check";
}

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

StepGraphs::StepGraphs(CudaGraphs mode, Device device, const std::string& unsupported)
    : policy_(unsupported.empty() && (mode == CudaGraphs::Check || (mode == CudaGraphs::Auto && device.is_cuda())),
              mode == CudaGraphs::Off                           ? "--cuda-graphs off"
              : mode == CudaGraphs::Auto && !device.is_cuda()  ? "CPU devices have no CUDA graphs"
                                                                 : unsupported),
      emulate_(mode == CudaGraphs::Check) {}

void StepGraphs::fall_back(const std::string& why) {
  std::fprintf(stderr, "fanout: CUDA graphs off: %s; training steps run with plain launches\n", why.c_str());
}

void StepGraphs::other_pass() {
  if (policy_.other_pass()) graph_.reset();
}

namespace {
// What may have moved or rewritten a buffer a graph points at, since a mark:
// this thread's allocations, rewritten kept state, and the context's scratch
// grown on any thread (a sharded optimizer's norm runs on the main thread).
uint64_t moves(const Context& ctx) {
  return thread_device_allocs() + device_state_rewrites() + ctx.scratch_moves();
}
const char* const kDraws =
    "the model draws random numbers in training (Dropout), which a replayed graph would repeat";
// What a launch of the step adds on the host: its effects, then its gradient notices in order.
void after_launch(Context& ctx, const std::vector<std::function<void()>>& effects,
                  const std::vector<std::pair<size_t, size_t>>& notices) {
  for (auto& fn : effects) fn();
  for (auto [b, c] : notices) ctx.grad_ready(b, c);
}
}  // namespace

void StepGraphs::launch(Context& ctx) {
  if (emulate_) {
    // The step again under the capture check, its host effects and
    // gradient notices dropped: the captured ones stand in for them.
    std::vector<std::function<void()>> discard;
    std::vector<std::pair<size_t, size_t>> unused;
    run_captured(ctx, discard, unused);
  } else {
    graph_.launch(ctx.compute());
  }
  after_launch(ctx, effects_, notices_);
}

void StepGraphs::run_captured(Context& ctx, std::vector<std::function<void()>>& effects,
                              std::vector<std::pair<size_t, size_t>>& notices) {
  CaptureCheck check;
  auto hook = std::move(ctx.on_grad_ready);
  ctx.on_grad_ready = [&notices](size_t b, size_t c) { notices.emplace_back(b, c); };
  ctx.captured_effects = &effects;
  try {
    work_(ctx);
  } catch (...) {
    ctx.captured_effects = nullptr;
    ctx.on_grad_ready = std::move(hook);
    throw;
  }
  ctx.captured_effects = nullptr;
  ctx.on_grad_ready = std::move(hook);
}

void StepGraphs::train_step(Context& ctx, const std::string& key, const std::function<void()>& work) {
  work_ = [&work](Context&) { work(); };
  // An allocation on this thread since the last graph step may have moved a
  // buffer the graph points at (a pass outside the engine, a layer grown),
  // and kept state may have been rewritten: warm up again.
  const uint64_t before = moves(ctx);
  if (policy_.has_graph() && before != allocs_) other_pass();
  if (policy_.stats().on && ctx.on_grad_write)
    policy_.turn_off("gradients in flight (ZeRO-2) take memory as backward writes them");
  bool drop = false;
  const StepGraphPolicy::Action a = policy_.train_step(key, &drop);
  if (drop || !policy_.stats().on) graph_.reset();
  if (a == StepGraphPolicy::Action::Replay) {
    launch(ctx);
    return;
  }
  if (a == StepGraphPolicy::Action::Plain) {
    const uint64_t draws = ctx.random_draws;
    work();
    if (ctx.random_draws != draws && policy_.stats().on) {
      policy_.turn_off(kDraws);
      fall_back(policy_.stats().off_reason);
    }
    allocs_ = moves(ctx);
    return;
  }
  // Capture: nothing queued inside runs until the graph is launched. Every
  // failure leaves the stream out of capture, the effects unset, the policy
  // off, and the step run plainly.
  effects_.clear();
  notices_.clear();
  const uint64_t draws = ctx.random_draws, frees = thread_frees_in_capture();
  std::string why;
  bool ok = false;
  if (emulate_) {
    // Check mode runs the step for real under the check: a failure is the
    // user's answer, not something to run again.
    try {
      run_captured(ctx, effects_, notices_);
    } catch (const std::exception& e) {
      const std::string msg = std::string("--cuda-graphs check: this training step cannot be captured: ") + e.what();
      policy_.captured(false, msg);
      effects_.clear();
      notices_.clear();
      throw Error(msg);
    }
    ok = ctx.random_draws == draws && moves(ctx) == before && thread_frees_in_capture() == frees;
    if (!ok)
      why = ctx.random_draws != draws ? kDraws
            : moves(ctx) != before    ? "the step rewrote kept device state while it was captured"
                                      : "the step freed memory while it was captured (a graph would write it after its reuse)";
    if (!ok) after_launch(ctx, effects_, notices_);  // the step has run: what a launch adds happens once
  } else {
    try {
      graph_.begin(ctx.compute());
      run_captured(ctx, effects_, notices_);
      ok = graph_.end(&why);
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {
      why = "an unknown exception";
    }
    graph_.abandon();  // no-op unless the capture is still open
    if (ok && ctx.random_draws != draws) {
      ok = false;
      why = kDraws;
    } else if (ok && moves(ctx) != before) {
      ok = false;
      why = "the step allocated device memory (or rewrote kept state) while it was captured";
    }
  }
  policy_.captured(ok, why);
  if (ok) {
    if (emulate_) after_launch(ctx, effects_, notices_);  // the step has run; only what a launch adds
    else launch(ctx);
    allocs_ = moves(ctx);
    return;
  }
  graph_.reset();
  effects_.clear();
  notices_.clear();
  fall_back(emulate_ ? why : "capturing a training step failed: " + why);
  if (!emulate_) work();  // the step itself, plainly (check mode ran it)
  allocs_ = moves(ctx);
}

std::string step_graph_key(const Tensor& x, const Tensor& y, float grad_scale, const std::vector<const void*>& arenas) {
  std::ostringstream k;
  k << x.shape().str() << dtype_name(x.dtype()) << '|' << y.shape().str() << dtype_name(y.dtype()) << '|';
  uint32_t bits = 0;
  std::memcpy(&bits, &grad_scale, sizeof bits);
  k << std::hex << bits << pointers_key(arenas);
  return k.str();
}

std::string pointers_key(const std::vector<const void*>& pointers) {
  std::ostringstream k;
  for (const void* p : pointers) k << '|' << p;
  return k.str();
}

}  // namespace fanout
