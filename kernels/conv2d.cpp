// Public 2-D convolution entry points: output shape, shape/dtype/device
// checks (kernels/conv_checks.h), then dispatch (CPU oneDNN, CUDA cuDNN).
#include "kernels/conv2d.h"

#include "kernels/conv_checks.h"
#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
detail::ConvSpec spec(const Conv2dGeometry& g) { return {"conv2d", 2, g.stride, g.padding}; }
}  // namespace

Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dGeometry& g) {
  return detail::conv_output_shape(spec(g), x, w);
}

void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                    Tensor& y) {
  detail::check_conv_forward(ctx, "conv2d_forward", spec(g), x, w, b, y);
  FANOUT_DISPATCH(ctx, conv2d_forward, ctx, x, w, b, g, y);
}

void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db) {
  detail::check_conv_backward(ctx, "conv2d_backward", spec(g), x, w, dy, dx, dw, db);
  FANOUT_DISPATCH(ctx, conv2d_backward, ctx, x, w, dy, g, dx, dw, db);
}

}  // namespace fanout::kernels
