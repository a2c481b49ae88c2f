// Group normalization entry points: checks, then dispatch.
#include "kernels/groupnorm.h"

#include "kernels/dispatch.h"

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
  check_shapes(ctx, op, x, gamma, groups, mean, rstd);
  detail::check_tensor(ctx, op, "beta", beta);
  detail::check_tensor(ctx, op, "y", y);
  FANOUT_CHECK(beta.shape() == gamma.shape() && y.shape() == x.shape() && eps >= 0.0f)
      << op << ": beta " << beta.shape().str() << ", y " << y.shape().str() << " or eps " << eps;
  if (x.numel() == 0) return;
  FANOUT_DISPATCH(ctx, group_norm_forward, ctx, x, gamma, beta, groups, eps, y, mean, rstd);
}

void group_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, int groups, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "group_norm_backward";
  check_shapes(ctx, op, x, gamma, groups, mean, rstd);
  detail::check_norm_backward(ctx, op, x, dy, gamma, dx, dgamma, dbeta);
  if (x.numel() == 0) return;
  FANOUT_DISPATCH(ctx, group_norm_backward, ctx, x, dy, gamma, mean, rstd, groups, dx, dgamma, dbeta);
}

}  // namespace fanout::kernels
