// Public 3-D convolution entry points: output shape, shape/dtype/device
// checks (kernels/conv_checks.h), then dispatch (CPU oneDNN, CUDA cuDNN).
#include "kernels/conv3d.h"

#include "kernels/conv_checks.h"
#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
detail::ConvSpec spec(const Conv3dGeometry& g) { return {"conv3d", 3, g.stride, g.padding}; }
}  // namespace

Shape conv3d_output_shape(const Shape& x, const Shape& w, const Conv3dGeometry& g) {
  return detail::conv_output_shape(spec(g), x, w);
}

void conv3d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv3dGeometry& g,
                    Tensor& y) {
  detail::check_conv_forward(ctx, "conv3d_forward", spec(g), x, w, b, y);
  FANOUT_DISPATCH(ctx, conv3d_forward, ctx, x, w, b, g, y);
}

void conv3d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv3dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db) {
  detail::check_conv_backward(ctx, "conv3d_backward", spec(g), x, w, dy, dx, dw, db);
  FANOUT_DISPATCH(ctx, conv3d_backward, ctx, x, w, dy, g, dx, dw, db);
}

}  // namespace fanout::kernels
