// Autocast helpers.
#include "runtime/nn/autocast.h"

#include "kernels/convert.h"
#include "kernels/elementwise.h"

namespace fanout {

void autocast_round(Context& ctx, Tensor& x) {
  if (autocast_on(ctx)) kernels::round_to(ctx, x, ctx.math.autocast);
}

Tensor autocast_copy(Context& ctx, const Tensor& x, Tensor& copy) {
  if (!autocast_on(ctx)) return x;
  ensure(copy, x.shape(), ctx.device());
  copy.copy_from(x, &ctx.compute());
  kernels::round_to(ctx, copy, ctx.math.autocast);
  return copy;
}

Tensor& LowGrad::sink(Context& ctx, Tensor& grad) {
  if (!autocast_on(ctx)) return grad;
  ensure(g_, grad.shape(), ctx.device());
  g_.zero(&ctx.compute());
  return g_;
}

void LowGrad::flush(Context& ctx, Tensor& grad) {
  if (!autocast_on(ctx)) return;
  kernels::round_to(ctx, g_, ctx.math.autocast);
  kernels::axpy(ctx, 1.0f, g_, grad);
}

}  // namespace fanout
