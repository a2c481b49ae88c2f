// BatchNorm2d, torch.nn.BatchNorm2d: training normalizes with the batch's
// statistics and updates running_mean / running_var (unbiased) with momentum;
// eval uses the running statistics. With a BatchStatSync installed the batch
// statistics span all replicas (SyncBatchNorm).
#pragma once
#include "runtime/nn/batch_stat_sync.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "BatchNorm2d"; }
  void reset_parameters(std::mt19937_64& rng) override;  // weight 1, bias 0, mean 0, var 1
  void set_batch_stat_sync(BatchStatSync* s) override { sync_ = s; }
  BatchStatSync* batch_stat_sync() const override { return sync_; }
  // Identifies this layer to the sync hook; set by models that use SyncBatchNorm.
  void set_layer_id(int id) { layer_id_ = id; }
  Parameter& weight() { return *w_; }
  Parameter& bias() { return *b_; }
  Buffer& running_mean() { return *rm_; }
  Buffer& running_var() { return *rv_; }
  int64_t num_batches_tracked() const;

 private:
  int64_t c_;
  float eps_, momentum_;
  Parameter *w_, *b_;
  Buffer *rm_, *rv_, *nbt_;
  BatchStatSync* sync_ = nullptr;
  int layer_id_ = 0;
  bool trained_forward_ = false;  // whether the last forward used batch statistics
  int64_t count_ = 0;
  Tensor x_, y_, dx_, stats_, mean_, invstd_, grad_stats_;
};

}  // namespace fanout::models
