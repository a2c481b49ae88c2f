// Per-channel bias entry points: checks, then dispatch; y and dy in any
// floating storage and format: CUDA as they are, the CPU through staging
// (its gradient reads channels-last storage as stored).
#include "kernels/conv_bias.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

void channel_bias_add(Context& ctx, Tensor& y, const Tensor& b) {
  const char* op = "channel_bias_add";
  Tensor ys = detail::cuda_alike(ctx, {&y}) ? y : detail::staged_out(ctx, op, "y", 2, y, /*accumulate=*/true);
  detail::check_activation(ctx, op, "y", ys);
  detail::check_tensor(ctx, op, "b", b);
  FANOUT_CHECK(y.dim() >= 2 && b.shape() == Shape{y.size(1)}) << op << ": b " << b.shape().str() << " for y "
                                                               << y.shape().str();
  if (y.numel() == 0) return;
  FANOUT_CALL_BACKEND(ctx, channel_bias_add, ctx, ys, b);
  detail::unstage(ctx, ys, y);
}

void channel_bias_grad(Context& ctx, const Tensor& dy, Tensor& db) {
  const char* op = "channel_bias_grad";
  const Tensor dys = detail::rows_alike(ctx, {&dy}) ? dy : detail::staged_in(ctx, op, "dy", 0, dy);
  detail::check_activation_or_rows(ctx, op, "dy", dys);
  detail::check_grad(ctx, op, "db", db);
  FANOUT_CHECK(dy.dim() >= 2 && db.shape() == Shape{dy.size(1)})
      << op << ": db " << db.shape().str() << " for dy " << dy.shape().str();
  if (dy.numel() == 0) return;
  FANOUT_DISPATCH(ctx, channel_bias_grad, ctx, dys, db);
}

}  // namespace fanout::kernels
