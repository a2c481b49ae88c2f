// Batch normalization layers, torch.nn.BatchNorm2d over (N, C, H, W) (also
// (N, C)) and torch.nn.BatchNorm3d over (N, C, D, H, W): training normalizes
// with the batch's statistics and updates running_mean / running_var
// (unbiased) with momentum; eval uses the running statistics. With a
// BatchStatSync installed the batch statistics span all replicas
// (SyncBatchNorm). Both share BatchNormNd; they differ in the input ranks
// they take and their type name.
#pragma once
#include "runtime/nn/batch_stat_sync.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class BatchNormNd : public Module {
 public:
  Tensor forward(const Tensor& x, Context& ctx) override;
  // relu(bn(x) + z), z optional (null: relu(bn(x))), in one pass of the
  // kernels (kernels::bn_apply_add_relu): the bits of this layer's forward,
  // an add rounded as autocast asks and an in-place ReLU. Sequential uses it
  // for a BatchNorm followed by a ReLU, BasicBlock for bn2, the shortcut's
  // add and the ReLU. The parameters and their names stay this layer's.
  Tensor forward_add_relu(const Tensor& x, const Tensor* z, Context& ctx);
  // After forward_add_relu: the gradient of the sum under the ReLU (dy
  // masked where the output is 0, z's gradient), written over dy as an
  // in-place ReLU writes it, with this layer's gradient sums taken in the
  // same pass. backward(g) then goes on from them; backward without it
  // calls it first.
  Tensor relu_grad(const Tensor& dy, Context& ctx);
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void reset_parameters(std::mt19937_64& rng) override;  // weight 1, bias 0, mean 0, var 1
  void set_batch_stat_sync(BatchStatSync* s) override { sync_ = s; }
  BatchStatSync* batch_stat_sync() const override { return sync_; }
  bool normalizes_over_batch() const override { return true; }
  // Identifies this layer to the sync hook; set by models that use SyncBatchNorm.
  void set_layer_id(int id) { layer_id_ = id; }
  int64_t channels() const { return c_; }
  Parameter& weight() { return *w_; }
  Parameter& bias() { return *b_; }
  Buffer& running_mean() { return *rm_; }
  Buffer& running_var() { return *rv_; }
  int64_t num_batches_tracked() const;

 protected:
  BatchNormNd(int64_t channels, float eps, float momentum);
  // Whether an input with this many dimensions is accepted.
  virtual bool accepts_rank(int rank) const = 0;
  // A new layer of type T with these hyper-parameters and layer id.
  template <class T>
  std::unique_ptr<Module> like() const {
    auto m = std::make_unique<T>(c_, eps_, momentum_);
    m->layer_id_ = layer_id_;
    return m;
  }

 private:
  int64_t c_;
  float eps_, momentum_;
  Parameter *w_, *b_;
  Buffer *rm_, *rv_, *nbt_;
  BatchStatSync* sync_ = nullptr;
  int layer_id_ = 0;
  // Checks x, keeps it and sizes y (and the statistics in training);
  // whether this forward uses batch statistics.
  bool begin_forward(const Tensor& x, Context& ctx);
  // The split kernels' batch statistics into mean_ and invstd_ (all-reduced
  // with SyncBatchNorm; the first forward's under a recomputation).
  void batch_statistics(const Tensor& x, Context& ctx);
  void check_count(const Tensor& x) const;
  // Whether a training pass with the ReLU runs as one kernel call each way
  // (kernels::bn_train_add_relu, kernels::bn_backward_relu).
  bool fuses_whole_pass(const Context& ctx) const;
  // Backward through an eval-mode forward: y = (x - rm) * k + beta with
  // k = gamma / sqrt(rv + eps), a fixed affine map per channel, as torch
  // differentiates it (frozen BatchNorm); the running statistics stay.
  Tensor eval_backward(const Tensor& dy, Context& ctx);

  bool trained_forward_ = false;  // whether the last forward used batch statistics
  bool relu_ = false;             // whether the last forward was forward_add_relu
  bool grad_reduced_ = false;     // relu_grad has taken grad_stats_ for the next backward
  bool dx_ready_ = false;         // relu_grad has written dx_ too
  bool mask_written_ = false;     // the forward kept the ReLU's bit mask in relu_mask_
  int64_t count_ = 0;
  Tensor x_, y_, dx_, stats_, mean_, invstd_, grad_stats_, dy_moved_, relu_mask_;
  // eval_backward's own: constants (C), and the running mean as (hi, lo),
  // 1 / sqrt(rv + eps) and the gradient sums, never a checkpoint slot.
  Tensor eval_zeros_, eval_ones_, eval_mean_, eval_invstd_, eval_grad_stats_;
};

// Input (N, C, H, W) or (N, C).
class BatchNorm2d : public BatchNormNd {
 public:
  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f)
      : BatchNormNd(channels, eps, momentum) {}
  std::unique_ptr<Module> make_like() const override { return like<BatchNorm2d>(); }
  std::string type_name() const override { return "BatchNorm2d"; }

 protected:
  bool accepts_rank(int rank) const override { return rank == 4 || rank == 2; }
};

// Input (N, C, D, H, W); the statistics run over N * D * H * W values per channel.
class BatchNorm3d : public BatchNormNd {
 public:
  explicit BatchNorm3d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f)
      : BatchNormNd(channels, eps, momentum) {}
  std::unique_ptr<Module> make_like() const override { return like<BatchNorm3d>(); }
  std::string type_name() const override { return "BatchNorm3d"; }

 protected:
  bool accepts_rank(int rank) const override { return rank == 5; }
};

}  // namespace fanout::models
