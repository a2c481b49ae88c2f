// Engine: runs one training or evaluation step of a model over a batch that
// lives in host memory. The single-device engine runs it directly; the
// DataParallel engine scatters it over replicas; the DDP engine does either
// in each process and all-reduces gradients across processes. The training
// loop only sees this interface.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/nn/criterion.h"
#include "runtime/nn/module.h"

namespace fanout {

// With math.split_invariant: checks that it can hold for `model` on `device`
// (CPU devices, no BatchNorm) and switches its gradients to float64, so
// training gives the same parameters however the batch is split. No-op when off.
void apply_split_invariant(Module& model, Device device, const MathOptions& math);

// Threads per kernel call for `replicas` CPU replicas running at once in each
// of `processes` processes on this machine: math.cpu_threads when set, else
// kernel_thread_budget() (the cores, or OMP_NUM_THREADS) shared out, at
// least one (one when split-invariant, whose results must not depend on the
// machine).
int cpu_threads_per_replica(int replicas, const MathOptions& math, int processes = 1);
// `math` with cpu_threads filled in as cpu_threads_per_replica says.
MathOptions with_cpu_threads(MathOptions math, int replicas, int processes = 1);

// ZeRO-1: one contiguous range [begin, end) of the parameter arena per
// replica. After a backward pass the replica's range of its gradient arena
// holds the reduced sum; an optimizer per range steps it there on the
// replica's context (runtime/train/sharded_optimizer.h).
struct ArenaShard {
  Module* replica;
  Context* ctx;
  int64_t begin, end;
};

// Context::pass_key of training pass `pass` of an engine seeded with `seed`.
uint64_t pass_key(uint64_t seed, uint64_t pass);

// Bytes of a model's parameter, gradient and buffer arenas.
int64_t arena_bytes(Module& m);

class Engine {
 public:
  virtual ~Engine() = default;
  // Forward, loss and backward of one batch (or micro-batch): gradients
  // accumulate (+=), each row's loss gradient scaled by `grad_scale`
  // (1 / the rows of the whole optimizer step, over every process).
  // sync = false skips the reduction across processes (DDP's no_sync) so
  // that micro-batches accumulate locally; single-process engines ignore it.
  // x (B, ...) float32 and y, the criterion's targets ((B) int32 class
  // indices or dense float32), both on the CPU.
  virtual StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) = 0;
  // forward_backward of a whole batch: each row's gradient scaled by
  // 1 / (rows over every process), reduced across processes. The reduced
  // gradients are then on model(), for an optimizer (runtime/optim) to step.
  StepResult forward_backward_batch(const Tensor& x, const Tensor& y) {
    return forward_backward(x, y, 1.0f / static_cast<float>(x.size(0) * world_size()), true);
  }
  // Forward in eval mode; no gradients.
  virtual StepResult eval_step(const Tensor& x, const Tensor& y) = 0;
  // The index of the next training pass, from which its random draws
  // (Dropout) are keyed (Context::pass_key). Engines count passes from 0 by
  // themselves; the Trainer sets it from its position in the run, so a
  // resumed run draws what the uninterrupted one did.
  virtual void set_pass(uint64_t index) {}
  virtual const Criterion& criterion() const = 0;
  // The model whose parameters are the ones trained (on the primary device):
  // its gradient arena holds the reduced gradients after forward_backward
  // with sync; an optimizer over it (with step_context()) updates it, and
  // the next forward carries the update to every replica.
  virtual Module& model() = 0;
  virtual Context& primary_context() = 0;
  // The context for an optimizer over model(): the primary's, or where the
  // replicas are CPU devices of this process, one on the primary that also
  // has their threads (idle between passes).
  virtual Context& step_context() { return primary_context(); }
  // This process's devices; the first is the primary.
  virtual std::vector<Device> devices() const = 0;

  // Distributed runs: this process's rank and the number of processes.
  virtual int rank() const { return 0; }
  virtual int world_size() const { return 1; }
  // The backend of the group over the processes ("gloo", "nccl"); empty
  // for one process.
  virtual std::string group_backend() const { return {}; }
  // Bytes the last training step sent to the primary device (outputs or
  // losses, and targets): what DataParallel pays and DDP does not. -1 where
  // the engine does not count them (DDP).
  virtual int64_t bytes_to_primary() const { return -1; }
  // Sums `v` over the processes, in place; `what` names the sum in errors
  // and hang reports ("epoch statistics", "the stop check").
  virtual void all_reduce_stats(std::vector<int64_t>& v, const char* what) {}
  virtual void barrier(const std::string& what) {}
  // Before an evaluation: every process takes rank 0's buffers (BatchNorm
  // running statistics) when the engine broadcasts buffers.
  virtual void prepare_eval() {}

  // Sharded engines (shard_optimizer): this process's shards, empty
  // otherwise; fn(i) run for every shard at once on its replica's thread;
  // and, after the shards' steps, every shard's parameters into model().
  virtual std::vector<ArenaShard> shards() { return {}; }
  // Bytes of each replica's arenas (parameters, gradients, buffers) in this
  // process, in device order.
  virtual std::vector<int64_t> replica_arena_bytes() { return {arena_bytes(model())}; }
  virtual void for_each_shard(const std::function<void(int)>& fn) {}
  virtual void gather_shards() {}
  // Sharded across processes (DDP, hybrid): every process's range of t
  // (laid out like the arena) from its owner, on every process; and the sum
  // of v over the processes. Collectives: every process calls them.
  virtual void gather_ranges(Tensor& t, const std::string& what) {}
  virtual double sum_over_processes(double v) { return v; }
};

}  // namespace fanout
