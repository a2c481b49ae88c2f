// Tanh, Sigmoid, GELU (exact), SiLU and LeakyReLU: torch.nn's layers of those
// names (no parameters). Forward keeps its input for backward, so the next
// layer may overwrite the output (an in-place ReLU after it is safe).
#pragma once
#include "kernels/activation.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class SmoothActivation : public Module {
 public:
  explicit SmoothActivation(kernels::Act kind, float negative_slope = 0.01f);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    return std::make_unique<SmoothActivation>(a_.kind, a_.negative_slope);
  }
  std::string type_name() const override { return kernels::activation_name(a_.kind); }

 private:
  kernels::Activation a_;
  Tensor x_, y_, dx_, dy_moved_;  // dy_moved_: an output gradient moved into x's storage
};

inline std::unique_ptr<Module> Tanh() { return std::make_unique<SmoothActivation>(kernels::Act::Tanh); }
inline std::unique_ptr<Module> Sigmoid() { return std::make_unique<SmoothActivation>(kernels::Act::Sigmoid); }
inline std::unique_ptr<Module> GELU() { return std::make_unique<SmoothActivation>(kernels::Act::Gelu); }
inline std::unique_ptr<Module> SiLU() { return std::make_unique<SmoothActivation>(kernels::Act::Silu); }
inline std::unique_ptr<Module> LeakyReLU(float negative_slope = 0.01f) {
  return std::make_unique<SmoothActivation>(kernels::Act::LeakyRelu, negative_slope);
}

}  // namespace fanout::models
