// ReLU layer.
#include "models/layers/activation.h"

#include "kernels/activation.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

Tensor ReLU::forward(const Tensor& x, Context& ctx) {
  if (inplace_) {
    y_ = x;  // shares x's storage
  } else {
    ensure_like(y_, x, ctx);
  }
  kernels::relu_forward(ctx, x, y_);
  return y_;
}

Tensor ReLU::backward(const Tensor& dy_in, Context& ctx) {
  if (!input_grad()) return Tensor();
  const Tensor dy = in_storage_of(ctx, dy_in, y_, dy_moved_);  // a gradient in another storage: into y's
  if (inplace_) {
    dx_ = dy;  // shares dy's storage
  } else {
    ensure_like(dx_, y_, ctx);
  }
  kernels::relu_backward(ctx, y_, dy, dx_);
  return dx_;
}

}  // namespace fanout::models
