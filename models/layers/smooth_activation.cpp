// Smooth activation layers.
#include "models/layers/smooth_activation.h"

#include <cmath>

#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

SmoothActivation::SmoothActivation(kernels::Act kind, float negative_slope) {
  FANOUT_USER_CHECK(std::isfinite(negative_slope)) << "LeakyReLU: negative slope must be finite, got "
                                                   << negative_slope;
  a_.kind = kind;
  a_.negative_slope = negative_slope;
}

Tensor SmoothActivation::forward(const Tensor& x, Context& ctx) {
  x_ = x;  // the input, for backward (nothing downstream writes it)
  ensure_like(y_, x, ctx);
  kernels::activation_forward(ctx, a_, x, y_);
  return y_;
}

Tensor SmoothActivation::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  dx_ = in_storage_of(ctx, dy, x_, dy_moved_);  // dx over dy (backward may overwrite dy), in x's storage
  kernels::activation_backward(ctx, a_, x_, dx_, dx_);
  return dx_;
}

}  // namespace fanout::models
