// DistributedDataParallel: one process per device (or per group of devices),
// each holding a full replica. At construction rank 0's parameters and
// buffers are broadcast; in backward each gradient bucket is all-reduced
// across processes as soon as it is ready (runtime/parallel/reducer.h: on
// CPUs on the reducer's thread, while backward goes on), so every process's
// optimizer steps on the same gradients. With several local devices a
// process runs DataParallel over them and all-reduces the primary's buckets
// (the hybrid): the same engine, with more devices.
//
// Averaging: every row's loss gradient is scaled by 1 / (rows over all
// processes) before the all-reduce sums, which is PyTorch's mean over the
// world without a division afterwards (so split-invariant math stays exact).
#pragma once
#include <memory>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "runtime/parallel/data_parallel.h"

namespace fanout {

struct DdpOptions {
  DataParallelOptions dp;         // for this process's devices (its group is set from the engine's)
  bool broadcast_buffers = true;  // rank 0's buffers to every process before each training forward
  int local_processes = 1;        // processes on this machine (CPU threads are shared among them)
  // More that every rank must agree on (the batch size, the optimizer...),
  // checked with the engine's own (parameters, buckets, precision, gradient
  // reduction, sharding, devices per process) before anything is exchanged.
  distributed::Agreement agree;
};

class DistributedDataParallelEngine : public Engine {
 public:
  // `group` spans the processes; its backend suits the devices (Gloo for CPU
  // devices, or for GPUs through host buffers; NCCL for GPUs).
  DistributedDataParallelEngine(Module& model, const std::vector<Device>& devices, const Criterion& criterion,
                                const DdpOptions& opts, std::unique_ptr<distributed::ProcessGroup> group);

  StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override { return inner_.eval_step(x, y); }
  void set_pass(uint64_t index) override { inner_.set_pass(index); }
  Module& model() override { return inner_.model(); }
  Context& primary_context() override { return inner_.primary_context(); }
  Context& step_context() override { return inner_.step_context(); }
  std::vector<Device> devices() const override { return inner_.devices(); }
  const Criterion& criterion() const override { return inner_.criterion(); }
  void prepare_eval() override;
  std::vector<Replica> replicas() override { return inner_.replicas(); }
  ProcessLink* process_link() const override { return &link_; }
  Sharding* sharding() override { return inner_.sharding(); }
  GraphStats graph_stats() const override { return inner_.graph_stats(); }

  distributed::ProcessGroup& group() { return link_.group(); }
  DataParallel& data_parallel() { return inner_.data_parallel(); }

 private:
  void broadcast_buffers();
  DataParallelEngine inner_;
  ProcessLink& link_;
  DdpOptions opts_;
};

}  // namespace fanout
