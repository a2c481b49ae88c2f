// Convolution layers, torch.nn.Conv2d over (N, C, H, W) and torch.nn.Conv3d
// over (N, C, D, H, W) (square / cubic kernel, groups 1, dilation 1): one
// layer for both ranks (kernels/conv.h).
#pragma once
#include "kernels/conv.h"
#include "runtime/nn/autocast.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class ConvNd : public Module {
 public:
  enum class Init { TorchDefault, KaimingNormalFanOut };
  // spatial: 2 or 3.
  ConvNd(int spatial, int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias, Init init);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::string type_name() const override { return spatial_ == 2 ? "Conv2d" : "Conv3d"; }
  // TorchDefault: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5));
  // KaimingNormalFanOut: N(0, sqrt(2 / (out * kernel volume))), torchvision's ResNet init.
  void reset_parameters(std::mt19937_64& rng) override;
  Parameter& weight() { return *w_; }
  Parameter* bias() { return b_; }

 protected:
  bool has_bias() const { return b_ != nullptr; }
  int spatial_;
  int64_t in_, out_, k_;
  kernels::ConvGeometry g_;
  Init init_;

 private:
  int64_t kernel_volume() const { return spatial_ == 2 ? k_ * k_ : k_ * k_ * k_; }
  Parameter* w_;
  Parameter* b_ = nullptr;
  Tensor x_, y_, dx_;
  AutocastWeights autocast_;
};

// The named ranks: Conv2d and Conv3d.
template <int Spatial>
class Conv final : public ConvNd {
 public:
  Conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true,
       Init init = Init::TorchDefault)
      : ConvNd(Spatial, in, out, kernel, stride, padding, bias, init) {}
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<Conv>(in_, out_, k_, g_.stride, g_.padding, has_bias(), init_);
  }
};
using Conv2d = Conv<2>;
using Conv3d = Conv<3>;

}  // namespace fanout::models
