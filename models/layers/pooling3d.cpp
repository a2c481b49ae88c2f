// Volumetric pooling and resampling layers.
#include "models/layers/pooling3d.h"

#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

MaxPool3d::MaxPool3d(int64_t kernel, int64_t stride, int64_t padding) : g_{kernel, stride, padding} {
  FANOUT_USER_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel)
      << "bad MaxPool3d hyper-parameters: kernel " << kernel << ", stride " << stride << ", padding " << padding
      << " (padding must be at most half the kernel)";
}

Tensor MaxPool3d::forward(const Tensor& x, Context& ctx) {
  const int64_t k = g_.kernel, p = g_.padding;
  FANOUT_USER_CHECK(x.dim() == 5 && x.size(2) + 2 * p >= k && x.size(3) + 2 * p >= k && x.size(4) + 2 * p >= k)
      << "MaxPool3d(kernel " << k << ", padding " << p << ") cannot take input of shape " << x.shape().str()
      << " (expected (N, C, D, H, W))";
  in_shape_ = x.shape();
  const Shape s = kernels::pool3d_output_shape(x.shape(), g_);
  ensure(y_, s, ctx.device());
  ensure(argmax_, s, DType::I32, ctx.device());
  kernels::maxpool3d_forward(ctx, x, g_, y_, argmax_);
  return y_;
}

Tensor MaxPool3d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  ensure(dx_, in_shape_, ctx.device());
  kernels::maxpool3d_backward(ctx, dy, argmax_, dx_);
  autocast_round(ctx, dx_);  // overlapping windows add gradients
  return dx_;
}

AvgPool3d::AvgPool3d(int64_t kernel, int64_t stride, int64_t padding) : g_{kernel, stride, padding} {
  FANOUT_USER_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel)
      << "bad AvgPool3d hyper-parameters: kernel " << kernel << ", stride " << stride << ", padding " << padding
      << " (padding must be at most half the kernel)";
}

Tensor AvgPool3d::forward(const Tensor& x, Context& ctx) {
  const int64_t k = g_.kernel, p = g_.padding;
  FANOUT_USER_CHECK(x.dim() == 5 && x.size(2) + 2 * p >= k && x.size(3) + 2 * p >= k && x.size(4) + 2 * p >= k)
      << "AvgPool3d(kernel " << k << ", padding " << p << ") cannot take input of shape " << x.shape().str()
      << " (expected (N, C, D, H, W))";
  in_shape_ = x.shape();
  ensure(y_, kernels::pool3d_output_shape(x.shape(), g_), ctx.device());
  kernels::avgpool3d_forward(ctx, x, g_, y_);
  autocast_round(ctx, y_);  // the input's type
  return y_;
}

Tensor AvgPool3d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  ensure(dx_, in_shape_, ctx.device());
  kernels::avgpool3d_backward(ctx, dy, g_, dx_);
  autocast_round(ctx, dx_);
  return dx_;
}

}  // namespace fanout::models
