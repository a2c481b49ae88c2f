// SGD over a model's flat parameter arena: torch.optim.SGD semantics
// (weight decay on every parameter, momentum buffer created from the first
// gradient, dampening, Nesterov), one fused kernel per step.
#pragma once
#include "kernels/sgd.h"
#include "runtime/nn/module.h"

namespace fanout::optim {

class SGD {
 public:
  // Refuses lr <= 0, momentum < 0, weight_decay < 0, and Nesterov without
  // momentum or with dampening, as torch does.
  SGD(Module& model, const kernels::SgdHyper& h);
  void set_lr(float lr) { h_.lr = lr; }
  float lr() const { return h_.lr; }
  const kernels::SgdHyper& hyper() const { return h_; }
  // p -= lr * update(grad); reads the model's gradient arena. float64
  // gradients (Module::set_grad_dtype) are rounded to float once, here.
  void step(Context& ctx);
  void zero_grad(Context& ctx);
  // Momentum buffer arena (same layout as the parameters) and whether it exists yet.
  Tensor& momentum_buffer() { return buf_; }
  bool has_momentum_buffer() const { return !first_; }
  void set_has_momentum_buffer(bool on) { first_ = !on; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 private:
  Module& model_;
  kernels::SgdHyper h_;
  Tensor buf_;
  Tensor grad32_;  // float64 gradients rounded to float
  bool first_ = true;
  int64_t steps_ = 0;
};

}  // namespace fanout::optim
