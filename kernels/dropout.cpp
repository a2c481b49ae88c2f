// Dropout entry point: checks, then dispatch.
#include "kernels/dropout.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, int64_t row_stride, Tensor& y) {
  const char* op = "dropout";
  detail::check_storage(ctx, op, "x", x);
  detail::check_like(ctx, op, "y", y, "x", x);
  FANOUT_CHECK(x.shape() == y.shape() && x.dim() >= 1) << op << ": x " << x.shape().str() << ", y " << y.shape().str();
  FANOUT_CHECK(p >= 0.0f && p <= 1.0f && first_row >= 0 && row_stride >= 1)
      << op << ": p " << p << ", first row " << first_row << ", row stride " << row_stride;
  if (x.numel() == 0) return;
  FANOUT_DISPATCH(ctx, dropout, ctx, x, p, key, first_row, row_stride, y);
}

}  // namespace fanout::kernels
