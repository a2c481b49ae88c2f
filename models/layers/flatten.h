// Flatten, torch.nn.Flatten(): (N, ...) -> (N, rest) as a view; backward
// restores the input's shape.
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Flatten>(); }
  std::string type_name() const override { return "Flatten"; }

 private:
  Shape in_shape_;
};

}  // namespace fanout::models
