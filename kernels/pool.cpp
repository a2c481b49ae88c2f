// Public pooling entry points: output shape, shape/dtype/device checks, then dispatch.
#include "kernels/pool.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

Shape pool2d_output_shape(const Shape& x, const PoolGeometry& g) {
  FANOUT_CHECK(x.ndim == 4) << "pool2d: x " << x.str() << " must be (N, C, H, W)";
  FANOUT_CHECK(g.kernel >= 1 && g.stride >= 1 && g.padding >= 0 && 2 * g.padding <= g.kernel)
      << "pool2d: bad kernel " << g.kernel << " / stride " << g.stride << " / padding " << g.padding
      << " (padding must be at most half the kernel)";
  const int64_t hp = x[2] + 2 * g.padding, wp = x[3] + 2 * g.padding;
  FANOUT_CHECK(hp >= g.kernel && wp >= g.kernel) << "pool2d: kernel " << g.kernel << " larger than padded input "
                                                 << hp << "x" << wp << " (x " << x.str() << ", padding "
                                                 << g.padding << ")";
  return Shape{x[0], x[1], (hp - g.kernel) / g.stride + 1, (wp - g.kernel) / g.stride + 1};
}

namespace {
void check_4d(const Context& ctx, const char* op, const char* name, const Tensor& t, DType dt = DType::F32) {
  detail::check_tensor(ctx, op, name, t, dt);
  FANOUT_CHECK(t.dim() == 4) << op << ": " << name << " " << t.shape().str() << " must be (N, C, H, W)";
}
// x (N, C, H, W) -> y: y must have the pooled shape.
void check_pooled(const char* op, const Tensor& x, const PoolGeometry& g, const char* y_name, const Tensor& y) {
  const Shape ys = pool2d_output_shape(x.shape(), g);
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << " with kernel " << g.kernel << ", stride " << g.stride << ", padding "
                                << g.padding << " gives " << ys.str();
}
// y (N, C, 1, 1) for x (N, C, H, W) with H * W >= 1.
void check_global(const char* op, const Tensor& x, const char* y_name, const Tensor& y) {
  FANOUT_CHECK((y.shape() == Shape{x.size(0), x.size(1), 1, 1}) && x.size(2) * x.size(3) >= 1)
      << op << ": " << y_name << " " << y.shape().str() << " for (N, C, H, W) " << x.shape().str()
      << ", expected (" << x.size(0) << ", " << x.size(1) << ", 1, 1)";
}
}  // namespace

void maxpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const char* op = "maxpool2d_forward";
  check_4d(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  detail::check_tensor(ctx, op, "argmax", argmax, DType::I32);
  check_pooled(op, x, g, "y", y);
  check_pooled(op, x, g, "argmax", argmax);
  FANOUT_DISPATCH(ctx, maxpool2d_forward, ctx, x, g, y, argmax);
}

void maxpool2d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const char* op = "maxpool2d_backward";
  check_4d(ctx, op, "dy", dy);
  detail::check_tensor(ctx, op, "argmax", argmax, DType::I32);
  check_4d(ctx, op, "dx", dx);
  FANOUT_CHECK(argmax.shape() == dy.shape() && dx.size(0) == dy.size(0) && dx.size(1) == dy.size(1))
      << op << ": dy " << dy.shape().str() << ", argmax " << argmax.shape().str() << " and dx " << dx.shape().str()
      << " do not match";
  FANOUT_DISPATCH(ctx, maxpool2d_backward, ctx, dy, argmax, dx);
}

void avgpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const char* op = "avgpool2d_forward";
  check_4d(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  check_pooled(op, x, g, "y", y);
  FANOUT_DISPATCH(ctx, avgpool2d_forward, ctx, x, g, y);
}

void avgpool2d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const char* op = "avgpool2d_backward";
  detail::check_tensor(ctx, op, "dy", dy);
  check_4d(ctx, op, "dx", dx);
  check_pooled(op, dx, g, "dy", dy);
  FANOUT_DISPATCH(ctx, avgpool2d_backward, ctx, dy, g, dx);
}

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const char* op = "global_avgpool_forward";
  check_4d(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  check_global(op, x, "y", y);
  FANOUT_DISPATCH(ctx, global_avgpool_forward, ctx, x, y);
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const char* op = "global_avgpool_backward";
  detail::check_tensor(ctx, op, "dy", dy);
  check_4d(ctx, op, "dx", dx);
  check_global(op, dx, "dy", dy);
  FANOUT_DISPATCH(ctx, global_avgpool_backward, ctx, dy, dx);
}

}  // namespace fanout::kernels
