// Head layout entry points: checks, then dispatch.
#include "kernels/heads.h"

#include <algorithm>

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
void check_layout(const Context& ctx, const char* op, const Tensor& rows, int64_t offset, const Tensor& heads,
                  int64_t t0) {
  FANOUT_CHECK(rows.defined() && heads.defined() && rows.dtype() == heads.dtype() &&
               (rows.dtype() == DType::F32 || rows.dtype() == DType::BF16 || rows.dtype() == DType::F16))
      << op << ": rows and heads must be one dtype of float32, bfloat16, float16";
  detail::check_tensor(ctx, op, "rows", rows, rows.dtype());
  detail::check_tensor(ctx, op, "heads", heads, heads.dtype());
  FANOUT_CHECK(rows.dim() == 3 && heads.dim() == 4 && rows.size(0) == heads.size(0) && t0 >= 0 &&
               t0 + rows.size(1) <= heads.size(2) && offset >= 0 &&
               offset + heads.size(1) * heads.size(3) <= rows.size(2))
      << op << ": rows " << rows.shape().str() << " (B, T, C) cannot hold heads " << heads.shape().str()
      << " (B, H, T, D) at column " << offset << " from position " << t0;
}
}  // namespace

void heads_from_rows(Context& ctx, const Tensor& rows, int64_t offset, Tensor& heads, int64_t t0) {
  FANOUT_CHECK(t0 >= -1) << "heads_from_rows: first position " << t0 << " (-1: the heads hold the rows' positions)";
  check_layout(ctx, "heads_from_rows", rows, offset, heads, std::max<int64_t>(t0, 0));
  FANOUT_CHECK(t0 >= 0 || rows.size(1) == heads.size(2))
      << "heads_from_rows: rows " << rows.shape().str() << " and heads " << heads.shape().str()
      << " differ in T (give the first position to fill a longer heads tensor)";
  if (rows.numel() == 0 || heads.numel() == 0) return;
  FANOUT_DISPATCH(ctx, heads_from_rows, ctx, rows, offset, heads, std::max<int64_t>(t0, 0));
}

void heads_to_rows(Context& ctx, const Tensor& heads, int64_t offset, Tensor& rows) {
  check_layout(ctx, "heads_to_rows", rows, offset, heads, 0);
  FANOUT_CHECK(rows.size(1) == heads.size(2))
      << "heads_to_rows: rows " << rows.shape().str() << " and heads " << heads.shape().str() << " differ in T";
  if (heads.numel() == 0) return;
  FANOUT_DISPATCH(ctx, heads_to_rows, ctx, heads, offset, rows);
}

}  // namespace fanout::kernels
