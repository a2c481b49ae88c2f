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
//   opt->step(); opt->zero_grad();       // an optimizer over `model` on the primary
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/nn/module.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/engine.h"
#include "runtime/parallel/reducer.h"
#include "runtime/parallel/step_graph.h"
#include "runtime/parallel/worker_pool.h"

namespace fanout {

struct DataParallelOptions {
  std::optional<Device> output_device;  // default: the primary (first) device
  int dim = 0;                          // scatter dimension; only 0 is supported
  bool sync_bn = false;                 // SyncBatchNorm across replicas
  std::string comm = "auto";            // auto, cpu, p2p, nccl
  size_t bucket_bytes = 4u << 20;       // gradient bucket size
  uint64_t seed = 0;                    // per-replica context RNG seeds derive from it
  bool require_all_grads = false;       // a backward in which a parameter got no gradient is an error (DDP)
  // DataParallelEngine: each replica computes its chunk's loss and output
  // gradient where its output lives and only the sums reach the primary;
  // false gathers the outputs on the output device and scatters the output
  // gradient back (torch.nn.DataParallel's way).
  bool loss_on_replicas = true;
  MathOptions math;
  // DDP and the hybrid: the processes whose primaries all-reduce every
  // gradient bucket after the local reduction (runtime/parallel/reducer.h).
  std::shared_ptr<distributed::ProcessGroup> group;
  // F32, or BF16: buckets rounded to bfloat16 around each reduction.
  DType grad_reduce_dtype = DType::F32;
  // ZeRO-1: the arena cut into one contiguous range per replica of every
  // process, each range's gradient summed onto its replica, for an
  // optimizer per range there (runtime/train/sharded_optimizer.h).
  bool shard_optimizer = false;
  // ZeRO-2 (implies shard_optimizer; CPU devices so far): each replica's
  // gradient arena holds only the buckets that meet its shard; the other
  // buckets' gradients live in pooled blocks until they are reduced
  // (runtime/parallel/reducer.h). Sums cross processes after every pass,
  // also those DDP's no_sync would keep.
  bool shard_grads = false;
  // CUDA graphs of each replica's step with the loss on the replicas
  // (runtime/parallel/step_graph.h); make_engine sets it from EngineSpec.
  CudaGraphs cuda_graphs = CudaGraphs::Auto;
};

// --grad-reduce-dtype: "fp32"/"float32" or "bf16"/"bfloat16"; anything else is a one-line error.
DType parse_grad_reduce_dtype(const std::string& s);

// torch.chunk's split of `batch` rows into at most `parts` chunks: ceil-sized,
// the last smaller, so fewer chunks where ceil-sized ones run out first (6
// rows in 4 parts: 2, 2, 2). Returns the chunk sizes.
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

  // Loss on the replicas: each replica runs forward on its chunk, then, on
  // its own thread and device, loss(replica, begin, end, output, ctx) for
  // rows [begin, end) of the batch, then (training) backward of the output
  // gradient it returns (null in eval mode), then done(replica, ctx) when
  // given: where results are read back without stalling between forward and
  // backward. Nothing is gathered, and backward() does not apply to this pass.
  using ReplicaLoss =
      std::function<const Tensor*(int replica, int64_t begin, int64_t end, const Tensor& out, Context& ctx)>;
  using ReplicaDone = std::function<void(int replica, Context& ctx)>;
  // With `stage` and a `step_key` (what else the launches depend on: the
  // targets' shape, the gradient scale), a training pass may capture each
  // replica's forward, loss and backward into a CUDA graph and replay it:
  // stage(replica, begin, end, ctx) then copies what the loss reads (the
  // targets) into buffers that stay put, before the captured part, and the
  // loss reads nothing else from the host.
  using ReplicaStage = std::function<void(int replica, int64_t begin, int64_t end, Context& ctx)>;
  void forward_backward_local(const Tensor& x, const ReplicaLoss& loss, const ReplicaDone& done = {},
                              const ReplicaStage& stage = {}, const std::string& step_key = {});
  // Replica 0's graph counts; on only while every replica's graphs are.
  GraphStats graph_stats() const;

  // Whether active replica i sends its output to the output device: every
  // replica but the first one on that device. Counted by replica, not by
  // device, so replicas sharing a GPU (0,0) count what distinct GPUs would
  // move (their gather is a copy within the GPU).
  bool sends_to_output(int i) const { return i != output_replica_; }
  // Bytes of the last forward's outputs that the other replicas sent to the
  // output device (parameter broadcasts and gradient reductions, the same
  // with the loss on the replicas, are not counted).
  int64_t gathered_bytes() const;
  // Rows of the last pass on active replica i, and its output's shape.
  int64_t chunk_rows(int i) const { return sizes_.at(i); }
  const Shape& replica_output_shape(int i) const { return out_shapes_.at(i); }

  Module& module() { return module_; }
  const std::vector<Device>& devices() const { return devices_; }
  Device output_device() const { return output_device_; }
  Context& primary_context() { return *contexts_[0]; }
  Context& output_context() { return *output_ctx_; }
  Context& step_context() { return step_ctx_ ? *step_ctx_ : primary_context(); }
  Context& replica_context(int i) { return *contexts_[i]; }
  Module& replica(int i) { return i == 0 ? module_ : *replicas_[i]; }
  int replicas_used() const { return active_; }
  const Comm& comm() const { return *comm_; }
  int num_buckets() const { return layout_.size(); }
  const BucketLayout& buckets() const { return layout_; }
  // The index of the next training pass (Engine::set_pass); counted from 0.
  void set_pass(uint64_t index) { pass_ = index; }
  // Whether the next training passes' gradients are reduced across
  // processes too (with a group; DDP's no_sync() is false). Default true.
  void set_sync(bool on) { sync_ = on; }
  // The process group (options.group), or null.
  ProcessLink* process_link() const { return reducer_->link(); }
  // Bytes replica i holds for gradients in flight (shard_grads), else 0.
  int64_t grads_in_flight_bytes(int i) const { return reducer_->in_flight_bytes(i); }
  // With shard_optimizer: the shards of every replica (runtime/parallel/sharding.h); null otherwise.
  Sharding* sharding() { return sharding_.get(); }

 private:
  class StatSync;
  void begin_pass(const Tensor& x);
  // Runs fn on every active replica; a failure aborts the pass and is rethrown.
  void run_replicas(const std::function<void(int)>& fn);
  Tensor replica_forward(int i, const Tensor& x);
  // Parameters and buffers from the primary, gradients made ready, and the
  // replica's chunk of x (copied into its own buffer when `stable` or when x
  // is not on its device).
  void prepare_replica(int i, const Tensor& x, bool stable);
  void replica_backward(int i, const Tensor& dy);
  void finish_backward(int i);  // after the backward: checks, the last buckets, the communicator

  Module& module_;
  std::vector<Device> devices_;
  Device output_device_;
  int output_replica_ = -1;  // the first replica on output_device_, or -1
  DataParallelOptions opts_;
  std::vector<std::unique_ptr<Module>> replicas_;  // [0] unused: the module itself
  std::vector<std::unique_ptr<Context>> contexts_;
  std::unique_ptr<Context> output_ctx_;
  std::unique_ptr<Context> step_ctx_;  // CPU replicas: the primary with every replica's threads
  std::mutex step_workers_mu_;         // held while step_ctx_'s kernels run on the replicas' threads
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<StatSync> stat_sync_;
  std::unique_ptr<WorkerPool> pool_;
  BucketLayout layout_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Sharding> sharding_;
  std::vector<std::unique_ptr<StepGraphs>> graphs_;  // [replica]
  uint64_t pass_ = 0;  // the next training pass
  bool sync_ = true;
  bool params_shared_ = false;  // CPU devices: every replica's parameters are the primary's arena
  std::vector<int64_t> sizes_, starts_;
  Shape batch_shape_;  // of the last pass's input
  std::vector<Tensor> in_chunks_, out_chunks_, dy_chunks_;
  std::vector<Tensor> graph_in_;  // [replica] the chunk a graph step reads, always the replica's own buffer
  Tensor gathered_;
  std::vector<Shape> out_shapes_;  // [rank] output chunk shapes of the last forward
  // Output shape of one sample for the last input sample shape: once known,
  // forward allocates the gathered output up front and each replica copies
  // its chunk in at the end of its own forward (no second round).
  Shape sample_in_;
  TensorSpec sample_out_;  // one sample's output: its shape (dim 0 set to 1), dtype and format
  bool sample_out_known_ = false;
  int active_ = 0;
  bool warned_small_batch_ = false;
  bool training_forward_ = false;
  bool gathered_pass_ = false;  // the last pass was forward(), so backward() may follow
};

// Engine over DataParallel: the loss on the replicas (or, without
// loss_on_replicas, on the output device); the gradients are reduced onto
// the primary's model for the caller's optimizer.
class DataParallelEngine : public Engine {
 public:
  // The criterion is cloned, once per replica.
  DataParallelEngine(Module& model, const std::vector<Device>& devices, const Criterion& criterion,
                     const DataParallelOptions& opts = {});
  StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override;
  void set_pass(uint64_t index) override { dp_.set_pass(index); }
  Module& model() override { return dp_.module(); }
  Context& primary_context() override { return dp_.primary_context(); }
  Context& step_context() override { return dp_.step_context(); }
  std::vector<Device> devices() const override { return dp_.devices(); }
  const Criterion& criterion() const override { return *criteria_[0]; }
  DataParallel& data_parallel() { return dp_; }
  bool loss_on_replicas() const { return on_replicas_; }
  std::vector<Replica> replicas() override;
  ProcessLink* process_link() const override { return dp_.process_link(); }
  Sharding* sharding() override { return dp_.sharding(); }
  GraphStats graph_stats() const override;
  // Bytes the last step moved to the primary (the output device) from the
  // other replicas: with the loss on the replicas, their sums (what the
  // criterion reads back); gathering, their outputs and their rows' targets.
  int64_t bytes_to_primary() const override { return bytes_to_primary_; }

 private:
  StepResult loss_step(const Tensor& x, const Tensor& y, bool train, float grad_scale);
  StepResult gathered_step(const Tensor& x, const Tensor& y, bool train, float grad_scale);
  DataParallel dp_;
  bool on_replicas_;
  std::vector<std::unique_ptr<Criterion>> criteria_;  // [replica]; [0] also serves the gathered path
  std::vector<Tensor> targets_;                       // [replica] targets on its device
  std::vector<StepResult> results_;                   // [replica] of the last pass
  int64_t bytes_to_primary_ = 0;
};

}  // namespace fanout
