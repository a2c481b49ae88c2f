// Conversion entry points: checks, then dispatch.
#include "kernels/convert.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
bool low(DType t) { return t == DType::BF16 || t == DType::F16; }
}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  const char* op = "convert";
  FANOUT_CHECK(src.defined() && dst.defined()) << op << ": undefined tensor";
  FANOUT_CHECK((src.dtype() == DType::F32 && low(dst.dtype())) || (low(src.dtype()) && dst.dtype() == DType::F32))
      << op << ": converts float32 to and from bfloat16 and float16, not " << dtype_name(src.dtype()) << " to "
      << dtype_name(dst.dtype());
  FANOUT_CHECK(src.numel() == dst.numel())
      << op << ": src " << src.shape().str() << " and dst " << dst.shape().str() << " differ in numel";
  detail::check_tensor(ctx, op, "src", src, src.dtype());
  detail::check_tensor(ctx, op, "dst", dst, dst.dtype());
  if (src.numel() == 0) return;
  FANOUT_DISPATCH(ctx, convert, ctx, src, dst);
}

void round_to(Context& ctx, Tensor& x, DType t) {
  detail::check_tensor(ctx, "round_to", "x", x);
  FANOUT_CHECK(low(t)) << "round_to: rounds to bfloat16 or float16, not " << dtype_name(t);
  if (x.numel() == 0) return;
  FANOUT_DISPATCH(ctx, round_to, ctx, x, t);
}

}  // namespace fanout::kernels
