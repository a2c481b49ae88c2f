// Public activation entry points: shape/dtype/device checks, then dispatch.
#include "kernels/activation.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  detail::check_tensor(ctx, "relu_forward", "x", x);
  detail::check_tensor(ctx, "relu_forward", "y", y);
  FANOUT_CHECK(x.shape() == y.shape()) << "relu_forward: x " << x.shape().str() << " and y " << y.shape().str()
                                       << " differ";
  FANOUT_DISPATCH(ctx, relu_forward, ctx, x, y);
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::check_tensor(ctx, "relu_backward", "y", y);
  detail::check_tensor(ctx, "relu_backward", "dy", dy);
  detail::check_tensor(ctx, "relu_backward", "dx", dx);
  FANOUT_CHECK(y.shape() == dy.shape() && y.shape() == dx.shape())
      << "relu_backward: y " << y.shape().str() << ", dy " << dy.shape().str() << " and dx " << dx.shape().str()
      << " differ";
  FANOUT_DISPATCH(ctx, relu_backward, ctx, y, dy, dx);
}

}  // namespace fanout::kernels
