// Public volumetric pooling / upsampling entry points: output shapes,
// shape/dtype/device checks, then dispatch.
#include "kernels/pool3d.h"

#include <climits>

#include "kernels/dispatch.h"
#include "kernels/pool.h"

namespace fanout::kernels {

Shape pool3d_output_shape(const Shape& x, const PoolGeometry& g) {
  FANOUT_CHECK(x.ndim == 5) << "pool3d: x " << x.str() << " must be (N, C, D, H, W)";
  FANOUT_CHECK(g.kernel >= 1 && g.stride >= 1 && g.padding >= 0 && 2 * g.padding <= g.kernel)
      << "pool3d: bad kernel " << g.kernel << " / stride " << g.stride << " / padding " << g.padding
      << " (padding must be at most half the kernel)";
  const int64_t dp = x[2] + 2 * g.padding, hp = x[3] + 2 * g.padding, wp = x[4] + 2 * g.padding;
  FANOUT_CHECK(dp >= g.kernel && hp >= g.kernel && wp >= g.kernel)
      << "pool3d: kernel " << g.kernel << " larger than padded input " << dp << "x" << hp << "x" << wp << " (x "
      << x.str() << ", padding " << g.padding << ")";
  return Shape{x[0], x[1], (dp - g.kernel) / g.stride + 1, (hp - g.kernel) / g.stride + 1,
               (wp - g.kernel) / g.stride + 1};
}

Shape upsample3d_output_shape(const Shape& x, int64_t scale) {
  FANOUT_CHECK(x.ndim == 5) << "upsample3d: x " << x.str() << " must be (N, C, D, H, W)";
  FANOUT_CHECK(scale >= 1) << "upsample3d: scale " << scale << " must be at least 1";
  return Shape{x[0], x[1], x[2] * scale, x[3] * scale, x[4] * scale};
}

namespace {
void check_5d(const Context& ctx, const char* op, const char* name, const Tensor& t, DType dt = DType::F32) {
  detail::check_tensor(ctx, op, name, t, dt);
  FANOUT_CHECK(t.dim() == 5) << op << ": " << name << " " << t.shape().str() << " must be (N, C, D, H, W)";
}
// argmax holds int32 indices into one (D, H, W) volume.
void check_volume_indexable(const char* op, const Tensor& x) {
  FANOUT_CHECK(x.size(2) * x.size(3) * x.size(4) <= INT32_MAX)
      << op << ": a volume of " << x.shape().str() << " has more elements than an int32 argmax can index";
}
void check_pooled(const char* op, const Tensor& x, const PoolGeometry& g, const char* y_name, const Tensor& y) {
  const Shape ys = pool3d_output_shape(x.shape(), g);
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << " with kernel " << g.kernel << ", stride " << g.stride << ", padding "
                                << g.padding << " gives " << ys.str();
}
void check_upsampled(const char* op, const Tensor& x, int64_t scale, const char* y_name, const Tensor& y) {
  const Shape ys = upsample3d_output_shape(x.shape(), scale);
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << " with scale " << scale << " gives " << ys.str();
}
}  // namespace

void maxpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const char* op = "maxpool3d_forward";
  check_5d(ctx, op, "x", x);
  check_volume_indexable(op, x);
  detail::check_tensor(ctx, op, "y", y);
  detail::check_tensor(ctx, op, "argmax", argmax, DType::I32);
  check_pooled(op, x, g, "y", y);
  check_pooled(op, x, g, "argmax", argmax);
  FANOUT_DISPATCH(ctx, maxpool3d_forward, ctx, x, g, y, argmax);
}

void maxpool3d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const char* op = "maxpool3d_backward";
  check_5d(ctx, op, "dy", dy);
  check_5d(ctx, op, "argmax", argmax, DType::I32);
  check_5d(ctx, op, "dx", dx);
  check_volume_indexable(op, dx);
  FANOUT_CHECK(argmax.shape() == dy.shape() && dx.size(0) == dy.size(0) && dx.size(1) == dy.size(1))
      << op << ": dy " << dy.shape().str() << ", argmax " << argmax.shape().str() << " and dx " << dx.shape().str()
      << " do not match";
  const auto planes = [](const Tensor& t) {
    return t.view(Shape{t.size(0), t.size(1), t.size(2) * t.size(3) * t.size(4), 1});
  };
  Tensor dx_planes = planes(dx);
  maxpool2d_backward(ctx, planes(dy), planes(argmax), dx_planes);
}

void avgpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const char* op = "avgpool3d_forward";
  check_5d(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  check_pooled(op, x, g, "y", y);
  FANOUT_DISPATCH(ctx, avgpool3d_forward, ctx, x, g, y);
}

void avgpool3d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const char* op = "avgpool3d_backward";
  check_5d(ctx, op, "dy", dy);
  check_5d(ctx, op, "dx", dx);
  check_pooled(op, dx, g, "dy", dy);
  FANOUT_DISPATCH(ctx, avgpool3d_backward, ctx, dy, g, dx);
}

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  const char* op = "upsample3d_nearest_forward";
  check_5d(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  check_upsampled(op, x, scale, "y", y);
  FANOUT_DISPATCH(ctx, upsample3d_nearest_forward, ctx, x, scale, y);
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  const char* op = "upsample3d_nearest_backward";
  detail::check_tensor(ctx, op, "dy", dy);
  check_5d(ctx, op, "dx", dx);
  check_upsampled(op, dx, scale, "dy", dy);
  FANOUT_DISPATCH(ctx, upsample3d_nearest_backward, ctx, dy, scale, dx);
}

}  // namespace fanout::kernels
