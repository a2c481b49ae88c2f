// 3-D convolution layer, torch.nn.Conv3d (cubic kernel, groups 1, dilation 1)
// over (N, C, D, H, W).
#pragma once
#include "kernels/conv.h"
#include "runtime/nn/autocast.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class Conv3d : public Module {
 public:
  enum class Init { TorchDefault, KaimingNormalFanOut };
  Conv3d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true,
         Init init = Init::TorchDefault);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "Conv3d"; }
  // TorchDefault: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in * k^3 (kaiming_uniform
  // with a = sqrt(5)); KaimingNormalFanOut: N(0, sqrt(2 / (out * k^3))).
  void reset_parameters(std::mt19937_64& rng) override;
  Parameter& weight() { return *w_; }  // (out, in, k, k, k)
  Parameter* bias() { return b_; }     // (out), or null

 private:
  int64_t in_, out_, k_;
  kernels::Conv3dGeometry g_;
  Init init_;
  Parameter* w_;
  Parameter* b_ = nullptr;
  Tensor x_, y_, dx_;
  AutocastWeights autocast_;
};

}  // namespace fanout::models
