// ReLU, torch.nn.ReLU.
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<ReLU>(); }
  std::string type_name() const override { return "ReLU"; }

 private:
  Tensor y_, dx_;
};

}  // namespace fanout::models
