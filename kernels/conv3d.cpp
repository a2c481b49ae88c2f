// Public 3-D convolution entry points: output shape, shape/dtype/device
// checks, then dispatch (CPU vol2col + GEMM, CUDA cuDNN).
#include "kernels/conv3d.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

Shape conv3d_output_shape(const Shape& x, const Shape& w, const Conv3dGeometry& g) {
  FANOUT_CHECK(x.ndim == 5 && w.ndim == 5) << "conv3d: x " << x.str() << " and w " << w.str()
                                           << " must be (N, C, D, H, W) and (OC, C, KD, KH, KW)";
  FANOUT_CHECK(x[1] == w[1]) << "conv3d: x " << x.str() << " has " << x[1] << " channels, w " << w.str()
                             << " expects " << w[1];
  FANOUT_CHECK(g.stride >= 1 && g.padding >= 0) << "conv3d: bad stride " << g.stride << " / padding " << g.padding;
  FANOUT_CHECK(w[0] >= 1 && w[2] >= 1 && w[3] >= 1 && w[4] >= 1) << "conv3d: empty kernel w " << w.str();
  const int64_t dp = x[2] + 2 * g.padding, hp = x[3] + 2 * g.padding, wp = x[4] + 2 * g.padding;
  FANOUT_CHECK(dp >= w[2] && hp >= w[3] && wp >= w[4])
      << "conv3d: kernel " << w[2] << "x" << w[3] << "x" << w[4] << " larger than padded input " << dp << "x" << hp
      << "x" << wp << " (x " << x.str() << ", padding " << g.padding << ")";
  return Shape{x[0], w[0], (dp - w[2]) / g.stride + 1, (hp - w[3]) / g.stride + 1, (wp - w[4]) / g.stride + 1};
}

namespace {
void check_conv(const Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor* b,
                const Conv3dGeometry& g, const Tensor& y, const char* y_name, bool b_is_grad = false) {
  detail::check_tensor(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "w", w);
  detail::check_tensor(ctx, op, y_name, y);
  const Shape ys = conv3d_output_shape(x.shape(), w.shape(), g);
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << ", w " << w.shape().str() << ", stride " << g.stride << ", padding "
                                << g.padding << " give " << ys.str();
  if (b) {
    if (b_is_grad) detail::check_grad(ctx, op, "db", *b);
    else detail::check_tensor(ctx, op, "bias", *b);
    FANOUT_CHECK(b->shape() == Shape{w.size(0)}) << op << ": bias " << b->shape().str() << " for w "
                                                 << w.shape().str();
  }
}
}  // namespace

void conv3d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv3dGeometry& g,
                    Tensor& y) {
  check_conv(ctx, "conv3d_forward", x, w, b, g, y, "y");
  FANOUT_DISPATCH(ctx, conv3d_forward, ctx, x, w, b, g, y);
}

void conv3d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv3dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db) {
  const char* op = "conv3d_backward";
  check_conv(ctx, op, x, w, db, g, dy, "dy", true);
  detail::check_grad(ctx, op, "dw", dw);
  FANOUT_CHECK(dw.shape() == w.shape()) << op << ": dw " << dw.shape().str() << " for w " << w.shape().str();
  FANOUT_CHECK(!db || db->dtype() == dw.dtype())
      << op << ": dw is " << dtype_name(dw.dtype()) << " but db is " << dtype_name(db->dtype());
  if (dx) {
    detail::check_tensor(ctx, op, "dx", *dx);
    FANOUT_CHECK(dx->shape() == x.shape()) << op << ": dx " << dx->shape().str() << " for x " << x.shape().str();
  }
  FANOUT_DISPATCH(ctx, conv3d_backward, ctx, x, w, dy, g, dx, dw, db);
}

}  // namespace fanout::kernels
