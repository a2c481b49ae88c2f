// Conversion entry points: checks, then dispatch.
#include "kernels/convert.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
bool low(DType t) { return t == DType::BF16 || t == DType::F16; }
}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  const char* op = "convert";
  detail::check_storage(ctx, op, "src", src);
  detail::check_storage(ctx, op, "dst", dst);
  const bool both_contiguous = !src.channels_last() && !dst.channels_last();
  FANOUT_CHECK(both_contiguous ? src.numel() == dst.numel() : src.shape() == dst.shape())
      << op << ": src " << src.shape().str() << " " << memory_format_name(src.format()) << " and dst "
      << dst.shape().str() << " " << memory_format_name(dst.format()) << " hold different elements";
  if (src.numel() == 0 || (src.raw() == dst.raw() && src.dtype() == dst.dtype() && src.format() == dst.format()))
    return;
  FANOUT_CHECK(src.raw() != dst.raw()) << op << ": dst is src in another type or format";
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
