// Public activation entry points: shape/dtype/device checks, then dispatch.
#include "kernels/activation.h"

#include "kernels/cpu/activation.h"
#include "kernels/dispatch.h"
#ifdef FANOUT_WITH_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace fanout::kernels {

void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  detail::check_tensor(ctx, "relu_forward", "x", x);
  detail::check_tensor(ctx, "relu_forward", "y", y);
  FANOUT_CHECK(x.shape() == y.shape()) << "relu_forward: x " << x.shape().str() << " and y " << y.shape().str()
                                       << " differ";
  if (ctx.device().is_cpu()) return cpu::relu_forward(ctx, x, y);
#ifdef FANOUT_WITH_CUDA
  if (ctx.device().is_cuda()) return cuda::relu_forward(ctx, x, y);
#endif
  no_backend("relu_forward", ctx.device());
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::check_tensor(ctx, "relu_backward", "y", y);
  detail::check_tensor(ctx, "relu_backward", "dy", dy);
  detail::check_tensor(ctx, "relu_backward", "dx", dx);
  FANOUT_CHECK(y.shape() == dy.shape() && y.shape() == dx.shape())
      << "relu_backward: y " << y.shape().str() << ", dy " << dy.shape().str() << " and dx " << dx.shape().str()
      << " differ";
  if (ctx.device().is_cpu()) return cpu::relu_backward(ctx, y, dy, dx);
#ifdef FANOUT_WITH_CUDA
  if (ctx.device().is_cuda()) return cuda::relu_backward(ctx, y, dy, dx);
#endif
  no_backend("relu_backward", ctx.device());
}

}  // namespace fanout::kernels
