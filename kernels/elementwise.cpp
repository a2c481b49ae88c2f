// Public elementwise entry points: numel/dtype/device checks, then dispatch.
#include "kernels/elementwise.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round) {
  const char* op = "add";
  detail::check_storage(ctx, op, "a", a);
  detail::check_storage(ctx, op, "b", b);
  detail::check_storage(ctx, op, "out", out);
  FANOUT_CHECK(a.numel() == b.numel() && a.numel() == out.numel())
      << "add: a " << a.shape().str() << ", b " << b.shape().str() << " and out " << out.shape().str()
      << " differ in numel";
  if (out.dtype() == DType::F32 && !out.channels_last() && (a.dtype() != DType::F32 || b.dtype() != DType::F32)) {
    // A float32 sum of mixed operands (the transformer's residual stream plus a
    // low-type branch): the low-type ones are widened first (staged).
    const Tensor as = detail::staged_in(ctx, op, "a", 0, a), bs = detail::staged_in(ctx, op, "b", 1, b);
    return add(ctx, as.view(out.shape()), bs.view(out.shape()), out, round);
  }
  detail::check_like(ctx, op, "b", b, "a", a);
  detail::check_like(ctx, op, "out", out, "a", a);
  FANOUT_CHECK(round == DType::F32 || round == a.dtype() ||
               ((round == DType::BF16 || round == DType::F16) && a.dtype() == DType::F32))
      << "add: cannot round " << dtype_name(a.dtype()) << " sums to " << dtype_name(round);
  // Low-type storage rounds as it is written: asking for its own type again is nothing more.
  const DType r = a.dtype() == DType::F32 ? round : DType::F32;
  FANOUT_DISPATCH(ctx, add, ctx, a, b, out, r);
}

void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y) {
  detail::check_tensor(ctx, "axpy", "x", x);
  detail::check_tensor(ctx, "axpy", "y", y);
  FANOUT_CHECK(x.numel() == y.numel()) << "axpy: x " << x.shape().str() << " and y " << y.shape().str()
                                       << " differ in numel";
  FANOUT_DISPATCH(ctx, axpy, ctx, alpha, x, y);
}

void scale(Context& ctx, float alpha, Tensor& x) {
  detail::check_tensor(ctx, "scale", "x", x);
  FANOUT_DISPATCH(ctx, scale, ctx, alpha, x);
}

}  // namespace fanout::kernels
