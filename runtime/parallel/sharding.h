// ZeRO over DataParallel's replicas, and under DDP and the hybrid over every
// process's replicas: the parameter arena cut into one contiguous range (a
// shard) per replica of every process. Shard s belongs to process
// s / replicas, to its replica s % replicas; process p owns shards
// [p * replicas, (p + 1) * replicas), one contiguous range of the arena.
//
// ShardPlan is the arithmetic, which the Reducer reads to send each
// gradient sum to its owner. Sharding binds a plan to this process's
// replicas and process link and does what the sharded optimizer
// (runtime/train/sharded_optimizer.h) needs of them: run every shard's step
// on its replica's thread, bring the updated shards back into the primary's
// parameters, assemble ranges held by other processes and sum over processes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/nn/module.h"
#include "runtime/parallel/process_link.h"

namespace fanout {

// What is sharded: the optimizer's state (ZeRO-1), and with it the reduced
// gradients (ZeRO-2: a replica keeps only its shard's sum).
enum class ShardMode { None, State, Grads };

class ShardPlan {
 public:
  ShardPlan() = default;  // nothing sharded: every sum goes to the primary
  // `elements` of the arena over `replicas` per process times `processes`
  // shards, balanced and aligned as parameters are (the last ends with the
  // arena); this process is `rank`.
  ShardPlan(ShardMode mode, int64_t elements, int replicas, int processes, int rank);
  bool empty() const { return bounds_.empty(); }
  ShardMode mode() const { return mode_; }
  int shards() const { return static_cast<int>(bounds_.size()) - 1; }
  int replicas() const { return replicas_; }
  int processes() const { return processes_; }
  int rank() const { return rank_; }
  // Shard s is [bounds[s], bounds[s + 1]).
  const std::vector<int64_t>& bounds() const { return bounds_; }
  std::pair<int64_t, int64_t> range(int s) const { return {bounds_[s], bounds_[s + 1]}; }
  // Local replica r's shard, and process p's range (its replicas' shards).
  std::pair<int64_t, int64_t> local(int r) const { return range(rank_ * replicas_ + r); }
  std::pair<int64_t, int64_t> process(int p) const { return {bounds_[p * replicas_], bounds_[(p + 1) * replicas_]}; }
  // The process that owns shard s.
  int home(int s) const { return s / replicas_; }
  // The local replica that receives shard s's sum in this process: its
  // owner, or for another process's shard the primary, which sends it on.
  int receiver(int s) const { return home(s) == rank_ ? s % replicas_ : 0; }

 private:
  ShardMode mode_ = ShardMode::None;
  std::vector<int64_t> bounds_;
  int replicas_ = 1, processes_ = 1, rank_ = 0;
};

// One shard as its optimizer sees it: the replica whose arenas it steps, on
// that replica's context, and its range of the arena.
struct ArenaShard {
  Module* replica;
  Context* ctx;
  int64_t begin, end;
};

class Sharding {
 public:
  // Runs fn(r) for every local replica r at once, each on its own thread.
  using RunAll = std::function<void(const std::function<void(int)>&)>;
  // `replicas` and `contexts` in device order (the first is the primary);
  // `link` spans the processes, or null in one process.
  Sharding(ShardPlan plan, std::vector<Module*> replicas, std::vector<Context*> contexts, ProcessLink* link,
           RunAll run_all);
  const ShardPlan& plan() const { return plan_; }
  bool across_processes() const { return link_ != nullptr; }
  // This process's shards, one per replica, in device order.
  std::vector<ArenaShard> shards() const;
  void run(const std::function<void(int)>& fn) { run_all_(fn); }
  // Before replica r's training forward: the ranges of its gradient arena
  // whose sums it does not receive are zeroed (they carry only this pass's
  // contribution); its own accumulate until the optimizer zeroes them.
  // Under ZeRO-2 the arena is a window: its part beyond the shard.
  void prepare_grads(int r);
  // After every shard's update: each replica's range of the parameters
  // into the primary's arena, then each process's range into every
  // process's primary (a collective).
  void gather_params();
  // Every process's range of t (laid out like the arena) from that
  // process, on every process (a collective; nothing in one process).
  void gather_ranges(Tensor& t, const std::string& what);
  // v summed over the processes (a collective; v in one process).
  double sum(double v, const std::string& what);

 private:
  std::vector<std::string> range_names(const std::string& what) const;
  void broadcast_ranges(Tensor& t, const std::vector<std::string>& names);

  ShardPlan plan_;
  std::vector<Module*> replicas_;
  std::vector<Context*> contexts_;
  ProcessLink* link_;
  RunAll run_all_;
  std::vector<std::string> param_names_;  // built once: gather_params runs every step
};

}  // namespace fanout
