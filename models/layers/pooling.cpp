// Pooling layers.
#include "models/layers/pooling.h"

#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

Tensor MaxPool2d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 4 && x.size(2) + 2 * g_.padding >= g_.kernel && x.size(3) + 2 * g_.padding >= g_.kernel)
      << "MaxPool2d(kernel " << g_.kernel << ") cannot take input of shape " << x.shape().str();
  in_shape_ = x.shape();
  const Shape s = kernels::pool2d_output_shape(x.shape(), g_);
  ensure(y_, s, ctx.device());
  ensure(argmax_, s, DType::I32, ctx.device());
  kernels::maxpool2d_forward(ctx, x, g_, y_, argmax_);
  return y_;
}

Tensor MaxPool2d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  ensure(dx_, in_shape_, ctx.device());
  kernels::maxpool2d_backward(ctx, dy, argmax_, dx_);
  autocast_round(ctx, dx_);  // overlapping windows add gradients
  return dx_;
}

Tensor AvgPool2d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 4 && x.size(2) + 2 * g_.padding >= g_.kernel && x.size(3) + 2 * g_.padding >= g_.kernel)
      << "AvgPool2d(kernel " << g_.kernel << ") cannot take input of shape " << x.shape().str();
  in_shape_ = x.shape();
  ensure(y_, kernels::pool2d_output_shape(x.shape(), g_), ctx.device());
  kernels::avgpool2d_forward(ctx, x, g_, y_);
  autocast_round(ctx, y_);
  return y_;
}

Tensor AvgPool2d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  ensure(dx_, in_shape_, ctx.device());
  kernels::avgpool2d_backward(ctx, dy, g_, dx_);
  autocast_round(ctx, dx_);
  return dx_;
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 4) << "AdaptiveAvgPool2d cannot take input of shape " << x.shape().str();
  in_shape_ = x.shape();
  ensure(y_, Shape{x.size(0), x.size(1), 1, 1}, ctx.device());
  kernels::global_avgpool_forward(ctx, x, y_);
  autocast_round(ctx, y_);
  return y_;
}

Tensor AdaptiveAvgPool2d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  ensure(dx_, in_shape_, ctx.device());
  kernels::global_avgpool_backward(ctx, dy, dx_);
  autocast_round(ctx, dx_);
  return dx_;
}

}  // namespace fanout::models
