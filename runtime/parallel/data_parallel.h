// DataParallel: one process, one model replica per device. Each forward
// scatters the batch along dim 0 like torch.chunk, runs every replica on its
// own persistent worker thread, and gathers the outputs on the output device;
// backward scatters the output gradient back and reduce-adds each gradient
// bucket onto the primary's gradient arena as soon as every replica has
// produced it. Replicas are built once; each forward refreshes their
// parameter and buffer arenas from the primary by broadcast.
//
// Usage, as with one device:
//   DataParallel dp(model, parse_devices("cpu:4"));
//   Tensor out = dp.forward(x);          // x on the host or on the primary
//   ... loss and dloss/dout on dp.output_device() ...
//   dp.backward(dout);                   // primary's grads now hold the sum
//   sgd.step(dp.primary_context());
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/nn/module.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/engine.h"
#include "runtime/parallel/worker_pool.h"

namespace fanout {

struct DataParallelOptions {
  std::optional<Device> output_device;  // default: the primary (first) device
  int dim = 0;                          // scatter dimension; only 0 is supported
  bool sync_bn = false;                 // SyncBatchNorm across replicas
  std::string comm = "auto";            // auto, cpu, p2p, nccl
  size_t bucket_bytes = 4u << 20;       // gradient bucket size
  uint64_t seed = 0;                    // per-replica context RNG seeds derive from it
  MathOptions math;
};

// torch.chunk's split of `batch` rows into at most `parts` chunks: ceil-sized,
// the last smaller, fewer chunks when batch < parts. Returns the chunk sizes.
std::vector<int64_t> chunk_sizes(int64_t batch, int parts);

class DataParallel {
 public:
  // `module` must be materialized on devices[0]; it becomes replica 0.
  DataParallel(Module& module, const std::vector<Device>& devices, const DataParallelOptions& opts = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Tensor forward(const Tensor& x);
  void backward(const Tensor& dy);

  Module& module() { return module_; }
  const std::vector<Device>& devices() const { return devices_; }
  Device output_device() const { return output_device_; }
  Context& primary_context() { return *contexts_[0]; }
  Context& output_context() { return *output_ctx_; }
  Context& replica_context(int i) { return *contexts_[i]; }
  Module& replica(int i) { return i == 0 ? module_ : *replicas_[i]; }
  int replicas_used() const { return active_; }
  const Comm& comm() const { return *comm_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int64_t begin = 0, count = 0;  // arena elements
    int params = 0;                // parameters inside
  };
  class StatSync;
  void on_grad_ready(int rank, size_t begin, size_t count);
  void issue_ready_buckets(int rank);
  void flush_buckets(int rank);

  Module& module_;
  std::vector<Device> devices_;
  Device output_device_;
  DataParallelOptions opts_;
  std::vector<std::unique_ptr<Module>> replicas_;  // [0] unused: the module itself
  std::vector<std::unique_ptr<Context>> contexts_;
  std::unique_ptr<Context> output_ctx_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<StatSync> stat_sync_;
  std::unique_ptr<WorkerPool> pool_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> param_offsets_;  // sorted
  std::vector<int> param_bucket_;       // bucket of each parameter
  std::vector<std::vector<int>> ready_; // [rank][bucket] parameters reported this backward
  std::vector<int> next_bucket_;        // [rank] next bucket to reduce (counts down)
  std::vector<int64_t> sizes_, starts_;
  std::vector<Tensor> in_chunks_, out_chunks_, dy_chunks_;
  Tensor gathered_;
  std::vector<Shape> out_shapes_;  // [rank] output chunk shapes of the last forward
  // Output shape of one sample for the last input sample shape: once known,
  // forward allocates the gathered output up front and each replica copies
  // its chunk in at the end of its own forward (no second round).
  Shape sample_in_, sample_out_;
  bool sample_out_known_ = false;
  int active_ = 0;
  bool warned_small_batch_ = false;
  bool training_forward_ = false;
};

// Engine over DataParallel: loss on the output device, SGD on the primary.
class DataParallelEngine : public Engine {
 public:
  DataParallelEngine(Module& model, const std::vector<Device>& devices, const kernels::SgdHyper& sgd,
                     const LossOptions& loss, const DataParallelOptions& opts);
  StepResult train_step(const Tensor& x, const Tensor& y, float lr) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override;
  Module& model() override { return dp_.module(); }
  optim::SGD& optimizer() override { return *sgd_; }
  Context& primary_context() override { return dp_.primary_context(); }
  DataParallel& data_parallel() { return dp_; }

 private:
  StepResult loss_step(const Tensor& x, const Tensor& y, bool train);
  DataParallel dp_;
  std::unique_ptr<optim::SGD> sgd_;
  LossOptions loss_;
  Tensor yd_, probs_, loss_t_, correct_t_, dlogits_, loss_h_, correct_h_;
};

}  // namespace fanout
