// Autocast: which op runs in which type under mixed precision
// (MathOptions::autocast = BF16 or F16), after torch.autocast's op lists.
//
//   convolutions (and transposed ones), linear layers: inputs, weights and
//     bias cast to the low type, accumulation in float32, output low; the
//     output gradient taken in the low type (the output is a low-type
//     tensor), dx, dW and db computed from the low-type tensors and rounded
//     to the low type (dW and db are then added to the float32 gradient
//     arena, as autocast's cast back does). On CUDA cuDNN and cuBLAS run in
//     the low type with float32 accumulation; a convolution's bias is added
//     to its low-type output in float32 and rounded again.
//   BatchNorm: float32 statistics and parameters, output and dx in the
//     input's type; dgamma and dbeta float32 (cuDNN's mixed BatchNorm)
//   GroupNorm, LayerNorm: float32 throughout, output float32 (autocast's
//     float32 list); dx in the input's type (low after a convolution or a
//     linear layer, float32 on GPT's float32 residual stream)
//   ReLU, max pooling, flatten: in the input's type (they only select values)
//   GELU/SiLU/Tanh/Sigmoid/LeakyReLU, average pooling, upsampling, dropout,
//     the residual add: computed in float32, output and dx stored in the
//     input's type (rounded when it is the low type; a float32 input stays
//     float32, as torch runs these ops in their input's type)
//   losses (softmax cross-entropy, MSE) and their reductions: float32 on the
//     low-type outputs; the loss gradient is rounded to the low type
//
// Storage: an activation that a convolution or a linear layer writes is a
// low-type tensor (ensure_autocast_output), channels-last when it has 4 or 5
// dims, as torch's autocast with channels_last stores it; every other layer
// writes its input's type and format, except the float32 ones above
// (GroupNorm, LayerNorm, the losses), and input gradients take their input's
// storage. Kernels read any storage with float32 arithmetic (natively or
// staged, kernels/staging.h), so CPU and CUDA store and round at the same
// points: a CPU step is the GPU's arithmetic up to float32 summation order
// (and, for a convolution with a bias, the GPU's one rounding more). A
// float32 tensor that autocast calls low holds values rounded to the low
// type (kernels::round_to): the autocast helpers below round float32
// tensors and leave low-type ones, already in their type, as they are.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout {

inline bool autocast_on(const Context& ctx) { return ctx.math.autocast != DType::F32; }

// Rounds a float32 x in place to autocast's low type (nothing when off or
// when x is stored in a low type).
void autocast_round(Context& ctx, Tensor& x);

// x cast to the low type: a rounded copy in `copy` (sized to x), or x itself
// when off or when x is stored in a low type.
Tensor autocast_copy(Context& ctx, const Tensor& x, Tensor& copy);

// Sizes y for an activation an autocast-list op writes: the low type (and
// channels-last with 4 or 5 dims) under autocast, float32 contiguous when off.
void ensure_autocast_output(Tensor& y, const Shape& s, Context& ctx);

// t in like's storage (dtype and format): t itself, or converted into buf.
// For a gradient that an elementwise op pairs with a saved activation.
Tensor in_storage_of(Context& ctx, const Tensor& t, const Tensor& like, Tensor& buf);
// t in like's memory format, in its own type: t itself, or converted into buf.
Tensor in_format_of(Context& ctx, const Tensor& t, const Tensor& like, Tensor& buf);

// A parameter's gradient computed in the low type: sink() is where the
// layer's backward accumulates (+=) its contribution, flush() moves it into
// the float32 gradient. Off, sink() is the gradient itself and flush() nothing.
// With a staging role the sink lives in the context's staging for that role
// from sink() to flush(), shared by every layer (a weight-sized buffer per
// layer otherwise); no other sink of that role may be open meanwhile.
class LowGrad {
 public:
  explicit LowGrad(int staging_role = -1) : role_(staging_role) {}
  Tensor& sink(Context& ctx, Tensor& grad);
  void flush(Context& ctx, Tensor& grad);

 private:
  Tensor g_;
  int role_;
};

// The autocast side of a layer with a weight and an optional bias
// (convolutions, linear): forward casts the input, weight and bias (and
// keeps them for backward); backward computes the weight and bias
// gradients into low-type sinks and rounds dx. With `kernel_rounds` (the
// kernels round as they read and write: kernels::conv_rounds_in_low_type,
// kernels::linear_rounds_in_low_type) x, w and dy go to them as they are,
// dW is added straight into the float32
// gradient and only what the kernels leave unrounded is rounded here: the
// bias, y after it, db, and dy where db is summed from it. Each skipped pass
// would repeat a rounding (rounding is idempotent), so the result is the same.
// With `low_weight` too (kernels that also take a weight stored in the low
// type: the linear ones) the float32 weight is narrowed once, in forward,
// and forward and backward multiply by that copy: one cast a step where
// each product narrowed it again (torch's autocast keeps such casts too).
class AutocastWeights {
 public:
  struct Cast {
    Tensor x, w, b;  // b undefined without a bias
  };
  // Off: x, w and b themselves.
  Cast forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, bool kernel_rounds = false,
               bool low_weight = false);
  // y rounded to the low type, unless the kernel already did (no bias).
  void round_output(Context& ctx, Tensor& y);
  struct Sinks {
    Tensor dy;         // the output gradient, in the low type (a handle: valid after the caller's dy is gone)
    const Tensor* w;   // the weight backward multiplies by
    Tensor* gw;        // where backward accumulates dW
    Tensor* gb;        // and db (null without a bias)
  };
  Sinks backward_begin(Context& ctx, const Tensor& dy, const Tensor& w, Tensor& gw, Tensor* gb);
  // Moves dW and db into the float32 gradients and rounds dx (when given).
  void backward_end(Context& ctx, Tensor& gw, Tensor* gb, Tensor* dx);

 private:
  Tensor x_, w_, b_, dy_;
  LowGrad gw_{Context::kGradSinkRole}, gb_;  // a layer's bias gradient is small: its own buffer
  bool kernel_rounds_ = false, has_bias_ = false, weight_cast_ = false;
};

}  // namespace fanout
