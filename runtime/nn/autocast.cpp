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

AutocastWeights::Cast AutocastWeights::forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b) {
  Cast c{autocast_copy(ctx, x, x_), autocast_copy(ctx, w, w_), Tensor()};
  if (b) c.b = autocast_copy(ctx, *b, b_);
  return c;
}

AutocastWeights::Sinks AutocastWeights::backward_begin(Context& ctx, const Tensor& dy, const Tensor& w, Tensor& gw,
                                                      Tensor* gb) {
  if (autocast_on(ctx)) autocast_copy(ctx, dy, dy_);
  return {autocast_on(ctx) ? &dy_ : &dy, autocast_on(ctx) ? &w_ : &w, &gw_.sink(ctx, gw), gb ? &gb_.sink(ctx, *gb) : nullptr};
}

void AutocastWeights::backward_end(Context& ctx, Tensor& gw, Tensor* gb, Tensor* dx) {
  gw_.flush(ctx, gw);
  if (gb) gb_.flush(ctx, *gb);
  if (dx) autocast_round(ctx, *dx);
}

}  // namespace fanout
