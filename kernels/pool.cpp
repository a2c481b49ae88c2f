// Public pooling and upsampling entry points for both ranks (kernels/pool.h):
// output shapes, shape/dtype/device checks, then dispatch; activations in any
// floating storage and format: CUDA takes them as they are when they are
// stored alike, the CPU's max pooling when they are stored alike
// channels-last; otherwise through staging.
#include "kernels/pool.h"

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {
const char* layout(int spatial) { return spatial == 3 ? "(N, C, D, H, W)" : "(N, C, H, W)"; }
}  // namespace

Shape pool_output_shape(int spatial, const Shape& x, const PoolGeometry& g) {
  FANOUT_CHECK(spatial == 2 || spatial == 3) << "pooling over " << spatial << " spatial axes";
  const char* family = spatial == 3 ? "pool3d" : "pool2d";
  FANOUT_CHECK(x.ndim == spatial + 2) << family << ": x " << x.str() << " must be " << layout(spatial);
  FANOUT_CHECK(g.kernel >= 1 && g.stride >= 1 && g.padding >= 0 && 2 * g.padding <= g.kernel)
      << family << ": bad kernel " << g.kernel << " / stride " << g.stride << " / padding " << g.padding
      << " (padding must be at most half the kernel)";
  Shape y = x;
  std::string padded;
  bool fits = true;
  for (int a = 2; a < x.ndim; ++a) {
    const int64_t p = x[a] + 2 * g.padding;
    padded.append(a > 2 ? "x" : "").append(std::to_string(p));
    fits = fits && p >= g.kernel;
    y[a] = (p - g.kernel) / g.stride + 1;
  }
  FANOUT_CHECK(fits) << family << ": kernel " << g.kernel << " larger than padded input " << padded << " (x "
                     << x.str() << ", padding " << g.padding << ")";
  return y;
}

PoolAxes pool_axes(int spatial, const Shape& x, const Shape& y, const PoolGeometry& g) {
  PoolAxes a;
  for (int i = 0; i < 3; ++i) {
    const bool real = i > 0 || spatial == 3;
    const int axis = i + spatial - 1;  // x's axis for depth (3-D), row, column
    a.len[i] = real ? x[axis] : 1;
    a.out[i] = real ? y[axis] : 1;
    a.g[i] = real ? g : PoolGeometry{1, 1, 0};
    if (a.out[i] == 1) a.g[i].stride = 1;  // one window: its stride is never used (and fits any index type)
  }
  return a;
}

Shape upsample3d_output_shape(const Shape& x, int64_t scale) {
  FANOUT_CHECK(x.ndim == 5) << "upsample3d: x " << x.str() << " must be (N, C, D, H, W)";
  FANOUT_CHECK(scale >= 1) << "upsample3d: scale " << scale << " must be at least 1";
  return Shape{x[0], x[1], x[2] * scale, x[3] * scale, x[4] * scale};
}

namespace {
// t on the context (an activation, or an int32 argmax) with `spatial` spatial axes.
void check_rank(const Context& ctx, const char* op, const char* name, const Tensor& t, int spatial,
                bool argmax = false) {
  FANOUT_CHECK(spatial == 2 || spatial == 3) << op << ": pooling over " << spatial << " spatial axes";
  if (argmax) detail::check_tensor(ctx, op, name, t, DType::I32);
  else detail::check_activation_or_rows(ctx, op, name, t);
  FANOUT_CHECK(t.dim() == spatial + 2) << op << ": " << name << " " << t.shape().str() << " must be "
                                       << layout(spatial);
}
// x -> y: y must have the pooled shape.
void check_pooled(const char* op, int spatial, const Tensor& x, const PoolGeometry& g, const char* y_name,
                  const Tensor& y) {
  const Shape ys = pool_output_shape(spatial, x.shape(), g);
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
// argmax holds int32 indices into one (n, c) plane or volume.
void check_volume_indexable(const char* op, const Tensor& x) {
  FANOUT_CHECK(x.numel() / std::max<int64_t>(1, x.size(0) * x.size(1)) <= INT32_MAX)
      << op << ": a volume of " << x.shape().str() << " has more elements than an int32 argmax can index";
}
void check_upsampled(const char* op, const Tensor& x, int64_t scale, const char* y_name, const Tensor& y) {
  const Shape ys = upsample3d_output_shape(x.shape(), scale);
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << " with scale " << scale << " gives " << ys.str();
}
// The forward's checks: x of the rank, y (and argmax, int32) of the pooled shape.
void check_pool_forward(const Context& ctx, const char* op, int spatial, const Tensor& x, const PoolGeometry& g,
                        const Tensor& y, const Tensor* argmax) {
  check_rank(ctx, op, "x", x, spatial);
  check_volume_indexable(op, x);
  detail::check_activation_or_rows(ctx, op, "y", y);
  check_pooled(op, spatial, x, g, "y", y);
  if (!argmax) return;
  detail::check_tensor(ctx, op, "argmax", *argmax, DType::I32);
  check_pooled(op, spatial, x, g, "argmax", *argmax);
}
// Max pooling's backward: dy and argmax alike, dx of the rank with their planes.
void check_max_backward(const Context& ctx, const char* op, int spatial, const Tensor& dy, const Tensor& argmax,
                        const Tensor& dx) {
  check_rank(ctx, op, "dy", dy, spatial);
  check_rank(ctx, op, "argmax", argmax, spatial, /*argmax=*/true);
  check_rank(ctx, op, "dx", dx, spatial);
  check_volume_indexable(op, dx);
  FANOUT_CHECK(argmax.shape() == dy.shape() && dx.size(0) == dy.size(0) && dx.size(1) == dy.size(1))
      << op << ": dy " << dy.shape().str() << ", argmax " << argmax.shape().str() << " and dx " << dx.shape().str()
      << " do not match";
}
// Average pooling's backward: dy of dx's pooled shape.
void check_avg_backward(const Context& ctx, const char* op, int spatial, const Tensor& dy, const PoolGeometry& g,
                        const Tensor& dx) {
  detail::check_activation(ctx, op, "dy", dy);
  check_rank(ctx, op, "dx", dx, spatial);
  check_pooled(op, spatial, dx, g, "dy", dy);
}
}  // namespace

// Every entry point takes its activations as they are on CUDA when they are
// stored alike, max pooling also on the CPU when they are stored alike
// channels-last (its row kernels); else staged.
void maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y,
                     Tensor& argmax) {
  const char* op = "maxpool_forward";
  detail::with_staged_unless_rows_alike(ctx, op, "x", x, "y", y, [&](const Tensor& xs, Tensor& ys) {
    check_pool_forward(ctx, op, spatial, xs, g, ys, &argmax);
    FANOUT_DISPATCH(ctx, maxpool_forward, ctx, spatial, xs, g, ys, argmax);
  });
}

void maxpool_backward(Context& ctx, int spatial, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const char* op = "maxpool_backward";
  detail::with_staged_unless_rows_alike(ctx, op, "dy", dy, "dx", dx, [&](const Tensor& dys, Tensor& dxs) {
    check_max_backward(ctx, op, spatial, dys, argmax, dxs);
    FANOUT_DISPATCH(ctx, maxpool_backward, ctx, spatial, dys, argmax, dxs);
  });
}

void avgpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const char* op = "avgpool_forward";
  detail::with_staged_unless_alike(ctx, op, "x", x, "y", y, [&](const Tensor& xs, Tensor& ys) {
    check_pool_forward(ctx, op, spatial, xs, g, ys, nullptr);
    FANOUT_DISPATCH(ctx, avgpool_forward, ctx, spatial, xs, g, ys);
  });
}

void avgpool_backward(Context& ctx, int spatial, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const char* op = "avgpool_backward";
  detail::with_staged_unless_alike(ctx, op, "dy", dy, "dx", dx, [&](const Tensor& dys, Tensor& dxs) {
    check_avg_backward(ctx, op, spatial, dys, g, dxs);
    FANOUT_DISPATCH(ctx, avgpool_backward, ctx, spatial, dys, g, dxs);
  });
}

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const char* op = "global_avgpool_forward";
  detail::with_staged_unless_alike(ctx, op, "x", x, "y", y, [&](const Tensor& xs, Tensor& ys) {
    check_rank(ctx, op, "x", xs, 2);
    detail::check_activation(ctx, op, "y", ys);
    check_global(op, xs, "y", ys);
    FANOUT_DISPATCH(ctx, global_avgpool_forward, ctx, xs, ys);
  });
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const char* op = "global_avgpool_backward";
  detail::with_staged_unless_alike(ctx, op, "dy", dy, "dx", dx, [&](const Tensor& dys, Tensor& dxs) {
    detail::check_activation(ctx, op, "dy", dys);
    check_rank(ctx, op, "dx", dxs, 2);
    check_global(op, dxs, "dy", dys);
    FANOUT_DISPATCH(ctx, global_avgpool_backward, ctx, dys, dxs);
  });
}

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  const char* op = "upsample3d_nearest_forward";
  detail::with_staged_unless_alike(ctx, op, "x", x, "y", y, [&](const Tensor& xs, Tensor& ys) {
    check_rank(ctx, op, "x", xs, 3);
    detail::check_activation(ctx, op, "y", ys);
    check_upsampled(op, xs, scale, "y", ys);
    FANOUT_DISPATCH(ctx, upsample3d_nearest_forward, ctx, xs, scale, ys);
  });
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  const char* op = "upsample3d_nearest_backward";
  detail::with_staged_unless_alike(ctx, op, "dy", dy, "dx", dx, [&](const Tensor& dys, Tensor& dxs) {
    detail::check_activation(ctx, op, "dy", dys);
    check_rank(ctx, op, "dx", dxs, 3);
    check_upsampled(op, dxs, scale, "dy", dys);
    FANOUT_DISPATCH(ctx, upsample3d_nearest_backward, ctx, dys, scale, dxs);
  });
}

}  // namespace fanout::kernels
