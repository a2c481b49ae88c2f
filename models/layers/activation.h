// ReLU, torch.nn.ReLU. With inplace (torchvision's ResNet uses it) forward
// writes over its input and backward over its output gradient, so neither
// keeps a buffer of its own: for a layer whose input nothing else reads
// afterwards (the output of a convolution, batch norm or linear layer).
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class ReLU : public Module {
 public:
  explicit ReLU(bool inplace = false) : inplace_(inplace) {}
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<ReLU>(inplace_); }
  std::string type_name() const override { return "ReLU"; }
  bool inplace() const { return inplace_; }

 private:
  bool inplace_;
  Tensor y_, dx_, dy_moved_;  // dy_moved_: an output gradient moved into y's storage
};

}  // namespace fanout::models
