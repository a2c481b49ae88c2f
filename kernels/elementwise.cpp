// Public elementwise entry points: numel/dtype/device checks, then dispatch.
#include "kernels/elementwise.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round) {
  detail::check_storage(ctx, "add", "a", a);
  detail::check_like(ctx, "add", "b", b, "a", a);
  detail::check_like(ctx, "add", "out", out, "a", a);
  FANOUT_CHECK(a.numel() == b.numel() && a.numel() == out.numel())
      << "add: a " << a.shape().str() << ", b " << b.shape().str() << " and out " << out.shape().str()
      << " differ in numel";
  FANOUT_CHECK(round == DType::F32 || ((round == DType::BF16 || round == DType::F16) && a.dtype() == DType::F32))
      << "add: cannot round " << dtype_name(a.dtype()) << " sums to " << dtype_name(round);
  FANOUT_DISPATCH(ctx, add, ctx, a, b, out, round);
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
