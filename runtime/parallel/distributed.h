// DistributedDataParallel: one process per device (or per group of devices),
// each holding a full replica. At construction rank 0's parameters and
// buffers are broadcast; in backward each gradient bucket is all-reduced
// across processes as soon as it is ready (on CPUs by a communication
// thread, while backward goes on), so every process's optimizer steps on
// the same gradients. With several local devices a process runs
// DataParallel over them and all-reduces the primary's buckets (hybrid).
//
// Averaging: every row's loss gradient is scaled by 1 / (rows over all
// processes) before the all-reduce sums, which is PyTorch's mean over the
// world without a division afterwards (so split-invariant math stays exact).
#pragma once
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/dist/process_group.h"
#include "runtime/parallel/data_parallel.h"

namespace fanout {

struct DdpOptions {
  DataParallelOptions dp;         // for this process's devices
  bool broadcast_buffers = true;  // rank 0's buffers to every process before each training forward
  int local_processes = 1;        // processes on this machine (CPU threads are shared among them)
};

class DistributedDataParallelEngine : public Engine, private CrossProcessHooks {
 public:
  // `group` spans the processes; its backend suits the devices (Gloo for CPU
  // devices, or for GPUs through host buffers; NCCL for GPUs).
  DistributedDataParallelEngine(Module& model, const std::vector<Device>& devices, const Criterion& criterion,
                                const DdpOptions& opts,
                                std::unique_ptr<dist::ProcessGroup> group);
  ~DistributedDataParallelEngine() override;

  StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override { return inner_.eval_step(x, y); }
  Module& model() override { return inner_.model(); }
  Context& primary_context() override { return inner_.primary_context(); }
  std::vector<Device> devices() const override { return inner_.devices(); }
  const Criterion& criterion() const override { return inner_.criterion(); }
  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->size(); }
  void all_reduce_stats(std::vector<int64_t>& v) override;
  void barrier(const std::string& what) override;
  void prepare_eval() override;

  dist::ProcessGroup& group() { return *group_; }
  DataParallel& data_parallel() { return inner_.data_parallel(); }

 private:
  void bucket_reduced(int bucket) override;
  void sum_batch_stats(Tensor& packed, Context& ctx) override;
  // All-reduce (sum) of a tensor on the primary or the host, staged through
  // the memory the group's backend takes when it differs.
  void all_reduce(Tensor& t, const std::string& what, uint32_t tag);
  void broadcast(Tensor& t, const std::string& what, uint32_t tag);
  void reduce_bucket(int b);
  void comm_loop();
  void broadcast_buffers();

  std::unique_ptr<dist::ProcessGroup> group_;
  DataParallelEngine inner_;
  DdpOptions opts_;
  bool host_group_ = true;  // the group takes host tensors (Gloo)
  bool sync_ = true;        // this backward all-reduces
  Tensor staging_;          // host or device copy for a group in the other memory

  // Communication thread (host-memory gradients): reduces buckets last to first
  // as bucket_reduced() marks them, while backward goes on.
  std::thread comm_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> ready_;  // [bucket] locally reduced this pass
  int next_ = -1;            // next bucket to all-reduce; -1: pass done
  bool stop_ = false;
  bool busy_ = false;        // a bucket's all-reduce is in flight
  std::exception_ptr comm_error_;
};

}  // namespace fanout
