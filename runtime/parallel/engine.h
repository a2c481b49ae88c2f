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
#include "runtime/parallel/process_link.h"
#include "runtime/parallel/step_graph.h"
#include "runtime/parallel/sharding.h"

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

// One replica of an engine in this process: its model and its context.
struct Replica {
  Module* model;
  Context* ctx;
  int64_t grads_in_flight_bytes = 0;  // gradient memory beside its arena (ZeRO-2's blocks)
};

// A one-line error when x or y is an undefined tensor (Tensor()) or x has no rows.
void check_batch_given(const Tensor& x, const Tensor& y);

// Context::pass_key of training pass `pass` of an engine seeded with `seed`.
uint64_t pass_key(uint64_t seed, uint64_t pass);


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
    check_batch_given(x, y);
    return forward_backward(x, y, 1.0f / static_cast<float>(x.size(0) * world_size()), true);
  }
  // Forward in eval mode; no gradients.
  virtual StepResult eval_step(const Tensor& x, const Tensor& y) = 0;
  // The index of the next training pass, from which its random draws
  // (Dropout) are keyed (Context::pass_key). Engines count passes from 0 by
  // themselves; the Trainer sets it from its position in the run, so a
  // resumed run draws what the uninterrupted one did.
  virtual void set_pass(uint64_t /*index*/) {}
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

  // This process's replicas in device order (the first is model() on the
  // primary context).
  virtual std::vector<Replica> replicas() { return {{&model(), &primary_context()}}; }
  // Bytes the last training step sent to the primary device (outputs or
  // losses, and targets): what DataParallel pays and DDP does not. -1 where
  // the engine does not count them (DDP).
  virtual int64_t bytes_to_primary() const { return -1; }
  // Before an evaluation: every process takes rank 0's buffers (BatchNorm
  // running statistics) when the engine broadcasts buffers.
  virtual void prepare_eval() {}
  // The link among the processes of a distributed run (DDP, hybrid); null
  // in one process.
  virtual ProcessLink* process_link() const { return nullptr; }
  // The shards of a sharded engine (ZeRO), for the sharded optimizer; null
  // when nothing is sharded.
  virtual Sharding* sharding() { return nullptr; }
  // CUDA graphs of training steps (runtime/parallel/step_graph.h): whether
  // they are on, how many steps were captured and replayed, and why not.
  virtual GraphStats graph_stats() const;

  // From the process link: this process's rank, the number of processes,
  // the group's backend ("gloo", "nccl"; empty in one process), sums of
  // counts over the processes in place (`what` names the sum in errors and
  // hang reports: "epoch statistics", "the stop check") and barriers.
  int rank() const { return process_link() ? process_link()->rank() : 0; }
  int world_size() const { return process_link() ? process_link()->size() : 1; }
  std::string group_backend() const { return process_link() ? process_link()->group().backend() : std::string(); }
  void all_reduce_stats(std::vector<int64_t>& v, const std::string& what) {
    if (ProcessLink* l = process_link()) l->all_reduce_counts(v, what);
  }
  void barrier(const std::string& what) {
    if (ProcessLink* l = process_link()) l->barrier(what);
  }
};

// Bytes of one replica's arenas.
struct ReplicaArenas {
  int64_t params = 0;   // 0 for a replica that reads the primary's in place (CPU devices)
  int64_t grads = 0;    // the gradient arena (or ZeRO-2 window) and gradients in flight
  int64_t buffers = 0;  // BatchNorm's running statistics
  int64_t total() const { return params + grads + buffers; }
};
// Each replica's in this process, in device order.
std::vector<ReplicaArenas> replica_arenas(Engine& engine);

}  // namespace fanout
