// GroupNorm, torch.nn.GroupNorm(num_groups, num_channels, eps, affine=True):
// each sample normalized over groups of channels (and every position), so
// the result does not depend on the batch: the norm for small per-device
// batches (3-D volumes at batch 6 over two GPUs), where BatchNorm's batch
// statistics fail. Input (N, C, ...); weight 1 and bias 0 initially.
#pragma once
#include "models/layers/norm_affine.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class GroupNorm : public Module {
 public:
  GroupNorm(int num_groups, int64_t num_channels, float eps = 1e-5f);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<GroupNorm>(groups_, c_, eps_); }
  std::string type_name() const override { return "GroupNorm"; }

 private:
  int groups_;
  int64_t c_;
  float eps_;
  NormAffine scale_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

// InstanceNorm2d / InstanceNorm3d, torch.nn.InstanceNormNd(num_features,
// eps, affine=False, track_running_stats=False): each (sample, channel)
// normalized over its positions, in training and evaluation alike (GroupNorm
// with one channel per group). Input (N, C, H, W) or (N, C, D, H, W); with
// affine, weight 1 and bias 0 initially, else no parameters.
class InstanceNorm : public Module {
 public:
  // spatial_dims 2 or 3.
  InstanceNorm(int spatial_dims, int64_t num_features, float eps = 1e-5f, bool affine = false);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<InstanceNorm>(dims_, c_, eps_, affine_);
  }
  std::string type_name() const override { return dims_ == 2 ? "InstanceNorm2d" : "InstanceNorm3d"; }

 private:
  int dims_;
  int64_t c_;
  float eps_;
  bool affine_;
  NormAffine scale_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

}  // namespace fanout::models
