// Dropout layer.
#include "models/layers/dropout.h"

#include <cmath>

#include "kernels/dropout.h"
#include "runtime/core/error.h"
#include "runtime/core/splitmix.h"

namespace fanout::models {

Dropout::Dropout(float p, bool inplace) : p_(p), inplace_(inplace) {
  FANOUT_USER_CHECK(std::isfinite(p) && p >= 0.0f && p <= 1.0f)
      << "Dropout: probability has to be between 0 and 1, got " << p;
}

Tensor Dropout::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() >= 1 && (x.dtype() == DType::F32 || x.dtype() == DType::BF16 || x.dtype() == DType::F16))
      << "Dropout cannot take input of shape " << x.shape().str() << " " << dtype_name(x.dtype());
  applied_ = ctx.training && p_ > 0.0f;
  if (!applied_) return x;
  key_ = salt_ == 0 ? ctx.pass_key : splitmix64(ctx.pass_key ^ splitmix64(salt_));
  ++ctx.random_draws;
  row_ = ctx.random_row;
  row_stride_ = ctx.random_row_stride;
  Tensor y = x;
  if (!inplace_) {
    ensure_like(y_, x, ctx);
    y = y_;
  }
  kernels::dropout(ctx, x, p_, key_, row_, row_stride_, y);
  return y;
}

Tensor Dropout::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  if (!applied_) return dy;
  Tensor dx = dy;  // backward may overwrite dy
  kernels::dropout(ctx, dy, p_, key_, row_, row_stride_, dx);
  return dx;
}

}  // namespace fanout::models
