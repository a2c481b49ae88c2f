// Softmax entry points: checks, then dispatch.
#include "kernels/softmax.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void softmax_forward(Context& ctx, const Tensor& x, bool causal, Tensor& y) {
  const char* op = "softmax_forward";
  detail::check_tensor(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "y", y);
  FANOUT_CHECK(x.dim() >= 1 && y.shape() == x.shape())
      << op << ": x " << x.shape().str() << " and y " << y.shape().str() << " must have one shape of 1 dim or more";
  FANOUT_CHECK(!causal || (x.dim() >= 2 && x.size(-1) == x.size(-2)))
      << op << ": causal x " << x.shape().str() << " must be (..., T, T)";
  FANOUT_CHECK(x.size(-1) <= INT32_MAX && (x.size(-1) == 0 || x.numel() / x.size(-1) <= INT32_MAX))
      << op << ": x " << x.shape().str() << " has too many rows or columns";
  if (x.numel() == 0) return;
  FANOUT_DISPATCH(ctx, softmax_forward, ctx, x, causal, y);
}

void softmax_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const char* op = "softmax_backward";
  detail::check_tensor(ctx, op, "y", y);
  detail::check_tensor(ctx, op, "dy", dy);
  detail::check_tensor(ctx, op, "dx", dx);
  FANOUT_CHECK(y.dim() >= 1 && dy.shape() == y.shape() && dx.shape() == y.shape())
      << op << ": y " << y.shape().str() << ", dy " << dy.shape().str() << " and dx " << dx.shape().str()
      << " must have one shape of 1 dim or more";
  FANOUT_CHECK(y.size(-1) <= INT32_MAX && (y.size(-1) == 0 || y.numel() / y.size(-1) <= INT32_MAX))
      << op << ": y " << y.shape().str() << " has too many rows or columns";
  if (y.numel() == 0) return;
  FANOUT_DISPATCH(ctx, softmax_backward, ctx, y, dy, dx);
}

}  // namespace fanout::kernels
