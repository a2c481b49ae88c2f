// CUDA graphs for training steps (--cuda-graphs auto|off). After a plain
// warm-up step, a training step whose launches depend on nothing that
// changes (the same shapes and dtypes, the same gradient scale, the same
// parameter and gradient arenas, no buffer allocated since) is captured into
// a CUDA graph once and replayed: one launch instead of hundreds. What a
// step changes on the host (Context::host_effect) is done again after each
// replay. A step that differs (the last smaller batch, an evaluation in
// between) runs plain and drops the graph, since a plain pass may move
// buffers; the next equal steps capture again. Graphs stay off on CPU
// devices, for models that draw random numbers in training (Dropout: a
// replay would repeat the captured keys), and after a capture fails (a call
// that capture forbids, such as a host synchronization inside the step):
// the step then runs plain, and stats() says why.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/graph.h"

namespace fanout {

// Check: no graph is made; each step that would be captured or replayed
// runs plainly under the capture check (runtime/core/graph.h) with the
// graph's bookkeeping (host effects and gradient notices after the step),
// on any device: what would break a capture is an error naming the call.
enum class CudaGraphs { Auto, Off, Check };
// "auto", "off" or "check"; anything else is a one-line error.
CudaGraphs parse_cuda_graphs(const std::string& s);
const char* cuda_graphs_name(CudaGraphs g);

struct GraphStats {
  bool on = false;          // steps may be captured and replayed
  int64_t captures = 0;     // graphs captured
  int64_t replays = 0;      // steps replayed from a graph (the capturing step not counted)
  int64_t plain = 0;        // training steps run with plain launches
  std::string off_reason;   // why graphs are off; empty while on
};

// The decisions alone, over the keys of training steps (runtime-free, so
// that they are tested without a GPU).
class StepGraphPolicy {
 public:
  enum class Action { Plain, Capture, Replay };
  // on: --cuda-graphs auto on CUDA devices; otherwise off with `why`.
  StepGraphPolicy(bool on, std::string why);
  // A training step with `key`: Replay when a graph was captured at this
  // key; Capture when the last step was a plain training step at this key;
  // Plain otherwise. *drop is set when a graph of another key must go first.
  Action train_step(const std::string& key, bool* drop);
  // A pass that is not a training step (evaluation): the graph and the
  // warm-up are dropped (true when there was a graph).
  bool other_pass();
  // After Capture: ok keeps the graph; a failure turns graphs off for good.
  void captured(bool ok, const std::string& why);
  // Turns graphs off for good (the model draws random numbers).
  void turn_off(const std::string& why);
  bool has_graph() const { return !graph_key_.empty(); }
  const GraphStats& stats() const { return stats_; }

 private:
  GraphStats stats_;
  std::string graph_key_, warm_key_;
};

// The policy over one context's compute stream: runs a training step's
// launches plainly, captures them, or replays them.
class StepGraphs {
 public:
  // `unsupported`: graphs stay off for this reason (what the caller's step
  // does that a capture cannot hold).
  StepGraphs(CudaGraphs mode, Device device, const std::string& unsupported = {});
  // `work` queues one training step's launches on ctx's compute stream
  // (inputs already in buffers that stay put); `key` names everything
  // besides the arenas and allocations that those launches depend on.
  // The gradient notices work gives (Context::on_grad_ready) are kept while
  // it is captured and given after each launch, in their order, when the
  // whole backward has been queued.
  void train_step(Context& ctx, const std::string& key, const std::function<void()>& work);
  void other_pass();
  const GraphStats& stats() const { return policy_.stats(); }

 private:
  void fall_back(const std::string& why);
  // work under the capture check, its effects and notices kept.
  void run_captured(Context& ctx, std::vector<std::function<void()>>& effects,
                    std::vector<std::pair<size_t, size_t>>& notices);
  void launch(Context& ctx);  // the graph (check mode: the step again), then effects and notices
  StepGraphPolicy policy_;
  bool emulate_ = false;
  StreamGraph graph_;
  std::function<void(Context&)> work_;
  std::vector<std::function<void()>> effects_;
  std::vector<std::pair<size_t, size_t>> notices_;
  // After the last graph step: this thread's device allocations and the
  // process's rewrites of kept device state (runtime/core/memory.h).
  uint64_t allocs_ = 0;
};

// The launches of a training step depend on these: a key for StepGraphs.
std::string step_graph_key(const Tensor& x, const Tensor& y, float grad_scale, const std::vector<const void*>& arenas);
// The addresses alone, as step_graph_key writes them.
std::string pointers_key(const std::vector<const void*>& pointers);

}  // namespace fanout
