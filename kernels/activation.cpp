// Public activation entry points: shape/dtype/layout/device checks, then dispatch.
#include "kernels/activation.h"

#include <cmath>

#include "kernels/dispatch.h"

namespace fanout::kernels {

void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  detail::check_storage(ctx, "relu_forward", "x", x);
  detail::check_like(ctx, "relu_forward", "y", y, "x", x);
  FANOUT_CHECK(x.shape() == y.shape()) << "relu_forward: x " << x.shape().str() << " and y " << y.shape().str()
                                       << " differ";
  FANOUT_DISPATCH(ctx, relu_forward, ctx, x, y);
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::check_storage(ctx, "relu_backward", "y", y);
  detail::check_like(ctx, "relu_backward", "dy", dy, "y", y);
  detail::check_like(ctx, "relu_backward", "dx", dx, "y", y);
  FANOUT_CHECK(y.shape() == dy.shape() && y.shape() == dx.shape())
      << "relu_backward: y " << y.shape().str() << ", dy " << dy.shape().str() << " and dx " << dx.shape().str()
      << " differ";
  FANOUT_DISPATCH(ctx, relu_backward, ctx, y, dy, dx);
}

const char* activation_name(Act kind) {
  switch (kind) {
    case Act::Tanh: return "Tanh";
    case Act::Sigmoid: return "Sigmoid";
    case Act::Gelu: return "GELU";
    case Act::Silu: return "SiLU";
    case Act::LeakyRelu: return "LeakyReLU";
  }
  return "?";
}

void activation_forward(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  const char* op = "activation_forward";
  detail::check_storage(ctx, op, "x", x);
  detail::check_like(ctx, op, "y", y, "x", x);
  FANOUT_CHECK(x.shape() == y.shape()) << op << ": x " << x.shape().str() << " and y " << y.shape().str() << " differ";
  FANOUT_CHECK(std::isfinite(a.negative_slope)) << op << ": negative slope " << a.negative_slope;
  FANOUT_DISPATCH(ctx, activation_forward, ctx, a, x, y);
}

void activation_backward(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const char* op = "activation_backward";
  detail::check_storage(ctx, op, "x", x);
  detail::check_like(ctx, op, "dy", dy, "x", x);
  detail::check_like(ctx, op, "dx", dx, "x", x);
  FANOUT_CHECK(x.shape() == dy.shape() && x.shape() == dx.shape())
      << op << ": x " << x.shape().str() << ", dy " << dy.shape().str() << " and dx " << dx.shape().str() << " differ";
  FANOUT_DISPATCH(ctx, activation_backward, ctx, a, x, dy, dx);
}

}  // namespace fanout::kernels
