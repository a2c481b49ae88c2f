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

Shape channels_last_shape(const Shape& s) {
  FANOUT_CHECK(s.ndim >= 3) << "channels_last_shape: " << s.str() << " has no spatial dims";
  Shape r = s;
  for (int i = 1; i + 1 < s.ndim; ++i) r[i] = s[i + 1];
  r[s.ndim - 1] = s[1];
  return r;
}

namespace {
// first: the float32 channels-first tensor; last: the low-type channels-last one.
void check_channels_last_pair(Context& ctx, const char* op, const Tensor& first, const char* first_name,
                              const Tensor& last, const char* last_name) {
  FANOUT_CHECK(first.defined() && last.defined()) << op << ": undefined tensor";
  FANOUT_CHECK(first.dtype() == DType::F32 && low(last.dtype()))
      << op << ": " << first_name << " must be float32 and " << last_name << " bfloat16 or float16, not "
      << dtype_name(first.dtype()) << " and " << dtype_name(last.dtype());
  FANOUT_CHECK(first.dim() >= 3) << op << ": " << first_name << " " << first.shape().str()
                                 << " needs a batch, a channel and a spatial dim";
  FANOUT_CHECK(last.shape() == channels_last_shape(first.shape()))
      << op << ": " << last_name << " " << last.shape().str() << " is not " << first_name << " "
      << first.shape().str() << " with dim 1 last, " << channels_last_shape(first.shape()).str();
  detail::check_tensor(ctx, op, first_name, first, first.dtype());
  detail::check_tensor(ctx, op, last_name, last, last.dtype());
}
}  // namespace

void narrow_channels_last(Context& ctx, const Tensor& src, Tensor& dst) {
  check_channels_last_pair(ctx, "narrow_channels_last", src, "src", dst, "dst");
  if (src.numel() == 0) return;
  FANOUT_DISPATCH(ctx, narrow_channels_last, ctx, src, dst);
}

void widen_channels_first(Context& ctx, const Tensor& src, Tensor& dst, bool accumulate) {
  check_channels_last_pair(ctx, "widen_channels_first", dst, "dst", src, "src");
  if (src.numel() == 0) return;
  FANOUT_DISPATCH(ctx, widen_channels_first, ctx, src, dst, accumulate);
}

}  // namespace fanout::kernels
