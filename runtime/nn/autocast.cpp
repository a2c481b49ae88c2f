// Autocast helpers.
#include "runtime/nn/autocast.h"

#include "kernels/convert.h"
#include "kernels/elementwise.h"

namespace fanout {

void autocast_round(Context& ctx, Tensor& x) {
  if (autocast_on(ctx) && x.dtype() == DType::F32) kernels::round_to(ctx, x, ctx.math.autocast);
}

Tensor autocast_copy(Context& ctx, const Tensor& x, Tensor& copy) {
  if (!autocast_on(ctx) || x.dtype() != DType::F32) return x;
  ensure(copy, x.shape(), ctx);
  copy.copy_from(x, &ctx.compute());
  kernels::round_to(ctx, copy, ctx.math.autocast);
  return copy;
}

Tensor& LowGrad::sink(Context& ctx, Tensor& grad) {
  if (!autocast_on(ctx)) return grad;
  if (role_ >= 0) g_ = ctx.staging(role_, static_cast<size_t>(grad.numel()) * sizeof(float)).as(grad.shape(), DType::F32);
  else ensure(g_, grad.shape(), ctx);
  g_.zero(&ctx.compute());
  return g_;
}

void LowGrad::flush(Context& ctx, Tensor& grad) {
  if (!autocast_on(ctx)) return;
  kernels::round_to(ctx, g_, ctx.math.autocast);
  kernels::axpy(ctx, 1.0f, g_, grad);
  if (role_ >= 0) g_ = Tensor();  // no hold on staging that a larger sink may replace
}

AutocastWeights::Cast AutocastWeights::forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b,
                                               bool kernel_rounds, bool low_weight) {
  kernel_rounds_ = kernel_rounds && autocast_on(ctx);
  has_bias_ = b != nullptr;
  weight_cast_ = kernel_rounds_ && low_weight && w.dtype() == DType::F32;
  if (weight_cast_) {  // w_ holds the low-type copy both passes multiply by
    ensure(w_, w.shape(), ctx.math.autocast, ctx);
    kernels::convert(ctx, w, w_);
  }
  Cast c{kernel_rounds_ ? x : autocast_copy(ctx, x, x_),
         weight_cast_ ? w_ : kernel_rounds_ ? w : autocast_copy(ctx, w, w_), Tensor()};
  if (b) c.b = autocast_copy(ctx, *b, b_);
  return c;
}

void AutocastWeights::round_output(Context& ctx, Tensor& y) {
  if (!kernel_rounds_ || has_bias_) autocast_round(ctx, y);
}

AutocastWeights::Sinks AutocastWeights::backward_begin(Context& ctx, const Tensor& dy, const Tensor& w, Tensor& gw,
                                                      Tensor* gb) {
  if (!autocast_on(ctx)) return {dy, &w, &gw, gb};
  // db is a float32 sum of dy in every backend: dy is rounded first where there is one.
  const bool raw_dy = kernel_rounds_ && !gb;
  return {raw_dy ? dy : autocast_copy(ctx, dy, dy_), kernel_rounds_ && !weight_cast_ ? &w : &w_,
          kernel_rounds_ ? &gw : &gw_.sink(ctx, gw), gb ? &gb_.sink(ctx, *gb) : nullptr};
}

void AutocastWeights::backward_end(Context& ctx, Tensor& gw, Tensor* gb, Tensor* dx) {
  if (!kernel_rounds_) gw_.flush(ctx, gw);
  if (gb) gb_.flush(ctx, *gb);
  if (dx && !kernel_rounds_) autocast_round(ctx, *dx);
}

Tensor in_storage_of(Context& ctx, const Tensor& t, const Tensor& like, Tensor& buf) {
  if (t.dtype() == like.dtype() && t.format() == like.format()) return t;
  ensure_like(buf, like, ctx);
  kernels::convert(ctx, t, buf);
  return buf;
}

Tensor in_format_of(Context& ctx, const Tensor& t, const Tensor& like, Tensor& buf) {
  if (t.format() == like.format()) return t;
  ensure(buf, t.shape(), t.dtype(), t.device(), like.format());
  kernels::convert(ctx, t, buf);
  return buf;
}

void ensure_autocast_output(Tensor& y, const Shape& s, Context& ctx) {
  if (!autocast_on(ctx)) return ensure(y, s, ctx);
  ensure(y, s, ctx.math.autocast, ctx, s.ndim == 4 || s.ndim == 5 ? MemoryFormat::ChannelsLast
                                                                   : MemoryFormat::Contiguous);
}

}  // namespace fanout
