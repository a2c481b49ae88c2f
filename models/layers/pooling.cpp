// Pooling layers of both kinds and ranks, and global average pooling.
#include "models/layers/pooling.h"

#include "runtime/core/error.h"

namespace fanout::models {

PoolNd::PoolNd(Kind kind, int spatial, int64_t kernel, int64_t stride, int64_t padding)
    : kind_(kind), spatial_(spatial), g_{kernel, stride, padding} {
  FANOUT_CHECK(spatial == 2 || spatial == 3) << "pooling over " << spatial << " spatial axes";
  FANOUT_USER_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel)
      << "bad " << type_name() << " hyper-parameters: kernel " << kernel << ", stride " << stride << ", padding "
      << padding << " (padding must be at most half the kernel)";
}

std::string PoolNd::type_name() const {
  return std::string(kind_ == Kind::Max ? "MaxPool" : "AvgPool") + (spatial_ == 2 ? "2d" : "3d");
}

Tensor PoolNd::forward(const Tensor& x, Context& ctx) {
  bool fits = x.dim() == spatial_ + 2;
  for (int a = 2; fits && a < x.dim(); ++a) fits = x.size(a) + 2 * g_.padding >= g_.kernel;
  FANOUT_USER_CHECK(fits) << type_name() << "(kernel " << g_.kernel << ", padding " << g_.padding
                          << ") cannot take input of shape " << x.shape().str()
                          << (spatial_ == 2 ? " (expected (N, C, H, W))" : " (expected (N, C, D, H, W))");
  in_ = TensorSpec(x);
  const Shape s = kernels::pool_output_shape(spatial_, x.shape(), g_);
  ensure(y_, s, x.dtype(), ctx, x.format());  // the input's storage
  if (kind_ == Kind::Max) {
    ensure(argmax_, s, DType::I32, ctx);
    kernels::maxpool_forward(ctx, spatial_, x, g_, y_, argmax_);
    return y_;  // the input's values: already of its type
  }
  kernels::avgpool_forward(ctx, spatial_, x, g_, y_);
  return y_;
}

Tensor PoolNd::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  in_.ensure(dx_, ctx);
  if (kind_ == Kind::Max) kernels::maxpool_backward(ctx, spatial_, dy, argmax_, dx_);
  else kernels::avgpool_backward(ctx, spatial_, dy, g_, dx_);
  return dx_;
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 4) << "AdaptiveAvgPool2d cannot take input of shape " << x.shape().str();
  in_ = TensorSpec(x);
  ensure(y_, Shape{x.size(0), x.size(1), 1, 1}, x.dtype(), ctx, x.format());
  kernels::global_avgpool_forward(ctx, x, y_);
  return y_;
}

Tensor AdaptiveAvgPool2d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  in_.ensure(dx_, ctx);
  kernels::global_avgpool_backward(ctx, dy, dx_);
  return dx_;
}

}  // namespace fanout::models
