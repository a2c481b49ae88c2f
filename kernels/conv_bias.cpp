// Per-channel bias entry points: checks, then dispatch.
#include "kernels/conv_bias.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void channel_bias_add(Context& ctx, Tensor& y, const Tensor& b) {
  const char* op = "channel_bias_add";
  detail::check_tensor(ctx, op, "y", y);
  detail::check_tensor(ctx, op, "b", b);
  FANOUT_CHECK(y.dim() >= 2 && b.shape() == Shape{y.size(1)}) << op << ": b " << b.shape().str() << " for y "
                                                               << y.shape().str();
  if (y.numel() == 0) return;
  FANOUT_DISPATCH(ctx, channel_bias_add, ctx, y, b);
}

void channel_bias_grad(Context& ctx, const Tensor& dy, Tensor& db) {
  const char* op = "channel_bias_grad";
  detail::check_tensor(ctx, op, "dy", dy);
  detail::check_grad(ctx, op, "db", db);
  FANOUT_CHECK(dy.dim() >= 2 && db.shape() == Shape{dy.size(1)})
      << op << ": db " << db.shape().str() << " for dy " << dy.shape().str();
  if (dy.numel() == 0) return;
  FANOUT_DISPATCH(ctx, channel_bias_grad, ctx, dy, db);
}

}  // namespace fanout::kernels
