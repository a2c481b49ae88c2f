// Upsample3d over (N, C, D, H, W): torch.nn.Upsample(scale_factor=s,
// mode='nearest') with an integer s.
#pragma once
#include "kernels/pool.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class Upsample3d : public Module {
 public:
  explicit Upsample3d(int64_t scale);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Upsample3d>(scale_); }
  std::string type_name() const override { return "Upsample3d"; }
  int64_t scale() const { return scale_; }

 private:
  int64_t scale_;
  TensorSpec in_;
  Tensor y_, dx_;
};

}  // namespace fanout::models
