// Flatten, torch.nn.Flatten(): (N, ...) -> (N, rest) in the logical order,
// as a view of a contiguous input; a channels-last one is copied into that
// order first, as torch's flatten copies it. Backward restores the input's
// shape and storage.
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
  TensorSpec in_;
  Tensor y_, dx_;
};

}  // namespace fanout::models
