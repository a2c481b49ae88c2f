// LayerNorm, torch.nn.LayerNorm(normalized_shape, eps, elementwise_affine):
// each sample normalized over its last dims (normalized_shape), e.g. the
// features of every token of (N, L, D) with normalized_shape (D); weight 1
// and bias 0 of normalized_shape initially, none without elementwise_affine,
// and no bias with bias = false (torch >= 2.1's LayerNorm(bias=False)).
#pragma once
#include "models/layers/norm_affine.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class LayerNorm : public Module {
 public:
  LayerNorm(const Shape& normalized_shape, float eps = 1e-5f, bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void reset_parameters(std::mt19937_64& rng) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<LayerNorm>(shape_, eps_, affine_, bias_);
  }
  std::string type_name() const override { return "LayerNorm"; }

 private:
  Shape shape_;
  float eps_;
  bool affine_, bias_;
  NormAffine scale_;
  Tensor x_, y_, mean_, rstd_, dx_;
};

}  // namespace fanout::models
