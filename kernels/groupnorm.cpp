// Group normalization entry points: checks, then dispatch; x, y, dy and dx
// in any floating storage and format through staging (roles 0 to 2).
#include "kernels/groupnorm.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {
void check_shapes(Context& ctx, const char* op, const Tensor& x, const Tensor& gamma, int groups, const Tensor& mean,
                  const Tensor& rstd) {
  detail::check_tensor(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "gamma", gamma);
  detail::check_tensor(ctx, op, "mean", mean);
  detail::check_tensor(ctx, op, "rstd", rstd);
  FANOUT_CHECK(x.dim() >= 2 && groups >= 1 && x.size(1) % groups == 0)
      << op << ": x " << x.shape().str() << " cannot be split into " << groups << " groups of channels";
  FANOUT_CHECK(gamma.shape() == Shape{x.size(1)}) << op << ": gamma " << gamma.shape().str() << " for x "
                                                  << x.shape().str();
  const Shape stats{x.size(0), groups};
  FANOUT_CHECK(mean.shape() == stats && rstd.shape() == stats)
      << op << ": mean " << mean.shape().str() << " and rstd " << rstd.shape().str() << " must be " << stats.str();
}
}  // namespace

void group_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  const char* op = "group_norm_forward";
  const Tensor xs = detail::staged_in(ctx, op, "x", 0, x);
  Tensor ys = detail::staged_out(ctx, op, "y", 2, y);
  check_shapes(ctx, op, xs, gamma, groups, mean, rstd);
  detail::check_tensor(ctx, op, "beta", beta);
  detail::check_tensor(ctx, op, "y", ys);
  FANOUT_CHECK(beta.shape() == gamma.shape() && y.shape() == x.shape() && eps >= 0.0f)
      << op << ": beta " << beta.shape().str() << ", y " << y.shape().str() << " or eps " << eps;
  if (x.numel() == 0) return;
  FANOUT_CALL_BACKEND(ctx, group_norm_forward, ctx, xs, gamma, beta, groups, eps, ys, mean, rstd);
  detail::unstage(ctx, ys, y);
}

void group_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, int groups, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "group_norm_backward";
  const Tensor xs = detail::staged_in(ctx, op, "x", 0, x), dys = detail::staged_in(ctx, op, "dy", 1, dy);
  Tensor dxs = detail::staged_out(ctx, op, "dx", 2, dx);
  check_shapes(ctx, op, xs, gamma, groups, mean, rstd);
  detail::check_norm_backward(ctx, op, xs, dys, gamma, dxs, dgamma, dbeta);
  if (x.numel() == 0) return;
  FANOUT_CALL_BACKEND(ctx, group_norm_backward, ctx, xs, dys, gamma, mean, rstd, groups, dxs, dgamma, dbeta);
  detail::unstage(ctx, dxs, dx);
}

}  // namespace fanout::kernels
