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

class Conv2d final : public ConvNd {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true,
         Init init = Init::TorchDefault)
      : ConvNd(2, in, out, kernel, stride, padding, bias, init) {}
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<Conv2d>(in_, out_, k_, g_.stride, g_.padding, has_bias(), init_);
  }
};

class Conv3d final : public ConvNd {
 public:
  Conv3d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true,
         Init init = Init::TorchDefault)
      : ConvNd(3, in, out, kernel, stride, padding, bias, init) {}
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<Conv3d>(in_, out_, k_, g_.stride, g_.padding, has_bias(), init_);
  }
};

}  // namespace fanout::models
