// Layer normalization entry points: checks, then dispatch; x, y, dy and dx
// in any floating storage through staging (roles 0 to 2).
#include "kernels/layernorm.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {
void check_shapes(Context& ctx, const char* op, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                  const Tensor& rstd) {
  detail::check_tensor(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "gamma", gamma);
  detail::check_tensor(ctx, op, "mean", mean);
  detail::check_tensor(ctx, op, "rstd", rstd);
  const int64_t d = gamma.numel();
  FANOUT_CHECK(x.dim() >= 1 && d >= 1 && x.numel() % d == 0 && (x.numel() == 0 || (x.numel() / d) % x.size(0) == 0))
      << op << ": x " << x.shape().str() << " does not end in gamma's " << gamma.shape().str() << " elements";
  const Shape stats{d > 0 ? x.numel() / d : 0};
  FANOUT_CHECK(mean.shape() == stats && rstd.shape() == stats)
      << op << ": mean " << mean.shape().str() << " and rstd " << rstd.shape().str() << " must be " << stats.str();
}
}  // namespace

void layer_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  const char* op = "layer_norm_forward";
  FANOUT_CHECK(beta.numel() == gamma.numel() && y.shape() == x.shape() && eps >= 0.0f)
      << op << ": beta " << beta.shape().str() << ", y " << y.shape().str() << " or eps " << eps;
  detail::with_staged(ctx, op, "x", x, "y", y, [&](const Tensor& xs, Tensor& ys) {
    check_shapes(ctx, op, xs, gamma, mean, rstd);
    detail::check_tensor(ctx, op, "beta", beta);
    detail::check_tensor(ctx, op, "y", ys);
    if (x.numel() == 0) return;
    FANOUT_DISPATCH(ctx, layer_norm_forward, ctx, xs, gamma, beta, eps, ys, mean, rstd);
  });
}

void layer_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "layer_norm_backward";
  const Tensor xs = detail::staged_in(ctx, op, "x", 0, x), dys = detail::staged_in(ctx, op, "dy", 1, dy);
  Tensor dxs = detail::staged_out(ctx, op, "dx", 2, dx);
  check_shapes(ctx, op, xs, gamma, mean, rstd);
  detail::check_norm_backward(ctx, op, xs, dys, gamma, dxs, dgamma, dbeta);
  if (x.numel() == 0) return;
  FANOUT_CALL_BACKEND(ctx, layer_norm_backward, ctx, xs, dys, gamma, mean, rstd, dxs, dgamma, dbeta);
  detail::unstage(ctx, dxs, dx);
}

}  // namespace fanout::kernels
