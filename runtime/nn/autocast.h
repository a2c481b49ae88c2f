// Autocast: which op runs in which type under mixed precision
// (MathOptions::autocast = BF16 or F16), after torch.autocast's op lists.
//
//   convolutions, linear layers: inputs, weights and bias cast to the low
//     type, accumulation in float32, output low; dx, dW and db computed from
//     the low-type tensors and rounded to the low type (dW and db are then
//     added to the float32 gradient arena, as autocast's cast back does)
//   BatchNorm: float32 statistics and parameters, output and dx low;
//     dgamma and dbeta float32 (cuDNN's mixed BatchNorm)
//   GroupNorm: float32 throughout, output float32 (autocast's float32 list);
//     dx low (its input is a low-type activation)
//   ReLU, max pooling, flatten: in the input's type (they only select values)
//   GELU/SiLU/Tanh/Sigmoid/LeakyReLU, average pooling, upsampling, the
//     residual add: computed in float32 from low-type inputs, output and dx
//     rounded to the low type
//   losses (softmax cross-entropy, MSE) and their reductions: float32 on the
//     low-type outputs; the loss gradient is rounded to the low type
//
// On a CPU device every tensor stays float32 and "low" means rounded to the
// low type (kernels::round_to) at exactly these points, so a CPU step is the
// GPU's arithmetic up to float32 summation order; it is slower than float32,
// not faster.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout {

inline bool autocast_on(const Context& ctx) { return ctx.math.autocast != DType::F32; }

// Rounds x in place to autocast's low type (nothing when off).
void autocast_round(Context& ctx, Tensor& x);

// x cast to the low type: a rounded copy in `copy` (sized to x), or x itself when off.
Tensor autocast_copy(Context& ctx, const Tensor& x, Tensor& copy);

// A parameter's gradient computed in the low type: sink() is where the
// layer's backward accumulates (+=) its contribution, flush() moves it into
// the float32 gradient. Off, sink() is the gradient itself and flush() nothing.
class LowGrad {
 public:
  Tensor& sink(Context& ctx, Tensor& grad);
  void flush(Context& ctx, Tensor& grad);

 private:
  Tensor g_;
};

}  // namespace fanout
