// Linear layer, torch.nn.Linear: y = x W^T + b; x (N..., in) (any leading
// dims, as torch's), W (out, in), y (N..., out).
#pragma once
#include "runtime/nn/autocast.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "Linear"; }
  void reset_parameters(std::mt19937_64& rng) override;  // torch default: U(-1/sqrt(in), 1/sqrt(in))
  Parameter& weight() { return *w_; }
  Parameter* bias() { return b_; }

 private:
  int64_t in_, out_;
  Parameter* w_;
  Parameter* b_ = nullptr;
  Shape in_shape_;  // x's shape (N..., in)
  Tensor x_, y_, dx_;
  AutocastWeights autocast_;
};

}  // namespace fanout::models
