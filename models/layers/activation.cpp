// ReLU layer.
#include "models/layers/activation.h"

#include "kernels/activation.h"

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

Tensor ReLU::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  if (inplace_) {
    dx_ = dy;  // shares dy's storage
  } else {
    ensure_like(dx_, y_, ctx);
  }
  kernels::relu_backward(ctx, y_, dy, dx_);
  return dx_;
}

}  // namespace fanout::models
