// CUDA activations; CPU counterparts in kernels/cpu/activation.cpp.
#include "kernels/activation.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {
// NaN propagates (NaN < 0 is false), as torch.relu and the CPU kernel.
struct ReluOp {
  __device__ float operator()(float x) const { return x < 0.0f ? 0.0f : x; }
};
// (y, dy) -> dy where y > 0 else 0
struct ReluBackwardOp {
  __device__ float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};
}  // namespace

// y = max(x, 0) (=); y may alias x.
void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  detail::DeviceScope scope(ctx);
  detail::launch_map1(ctx, ReluOp{}, x.f32(), y.f32(), x.numel());
}

// dx = dy where y > 0 else 0 (=); dx may alias dy.
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::DeviceScope scope(ctx);
  detail::launch_map2(ctx, ReluBackwardOp{}, y.f32(), dy.f32(), dx.f32(), y.numel());
}

}  // namespace fanout::kernels::cuda
