// Public elementwise entry points: numel/dtype/device checks, then dispatch.
#include "kernels/elementwise.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/dispatch.h"
#ifdef FANOUT_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace fanout::kernels {

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out) {
  detail::check_tensor(ctx, "add", "a", a);
  detail::check_tensor(ctx, "add", "b", b);
  detail::check_tensor(ctx, "add", "out", out);
  FANOUT_CHECK(a.numel() == b.numel() && a.numel() == out.numel())
      << "add: a " << a.shape().str() << ", b " << b.shape().str() << " and out " << out.shape().str()
      << " differ in numel";
  if (ctx.device().is_cpu()) return cpu::add(ctx, a, b, out);
#ifdef FANOUT_WITH_CUDA
  if (ctx.device().is_cuda()) return cuda::add(ctx, a, b, out);
#endif
  no_backend("add", ctx.device());
}

void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y) {
  detail::check_tensor(ctx, "axpy", "x", x);
  detail::check_tensor(ctx, "axpy", "y", y);
  FANOUT_CHECK(x.numel() == y.numel()) << "axpy: x " << x.shape().str() << " and y " << y.shape().str()
                                       << " differ in numel";
  if (ctx.device().is_cpu()) return cpu::axpy(ctx, alpha, x, y);
#ifdef FANOUT_WITH_CUDA
  if (ctx.device().is_cuda()) return cuda::axpy(ctx, alpha, x, y);
#endif
  no_backend("axpy", ctx.device());
}

void scale(Context& ctx, float alpha, Tensor& x) {
  detail::check_tensor(ctx, "scale", "x", x);
  if (ctx.device().is_cpu()) return cpu::scale(ctx, alpha, x);
#ifdef FANOUT_WITH_CUDA
  if (ctx.device().is_cuda()) return cuda::scale(ctx, alpha, x);
#endif
  no_backend("scale", ctx.device());
}

}  // namespace fanout::kernels
