// CUDA activations; CPU counterparts in kernels/cpu/activation.cpp.
#include "kernels/activation.h"

#include "kernels/activation_math.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

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
  detail::launch_storage_map1(ctx, ReluOp{}, x, y);
}

// dx = dy where y > 0 else 0 (=); dx may alias dy.
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::DeviceScope scope(ctx);
  detail::launch_storage_map2(ctx, ReluBackwardOp{}, y, dy, dx);
}

}  // namespace fanout::kernels::cuda

namespace fanout::kernels::cuda {

namespace {
template <Act K>
struct ActForward {
  float slope;
  __device__ float operator()(float x) const { return act::forward<K>(x, slope); }
};
template <Act K>
struct ActBackward {
  float slope;
  __device__ float operator()(float x, float dy) const { return act::backward<K>(x, dy, slope); }
};
template <Act K>
void forward_as(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  detail::launch_storage_map1(ctx, ActForward<K>{a.negative_slope}, x, y);
}
template <Act K>
void backward_as(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  detail::launch_storage_map2(ctx, ActBackward<K>{a.negative_slope}, x, dy, dx);
}
}  // namespace

void activation_forward(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  detail::DeviceScope scope(ctx);
  act::with_kind(a.kind, [&](auto k) { forward_as<decltype(k)::value>(ctx, a, x, y); });
}

void activation_backward(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  detail::DeviceScope scope(ctx);
  act::with_kind(a.kind, [&](auto k) { backward_as<decltype(k)::value>(ctx, a, x, dy, dx); });
}

}  // namespace fanout::kernels::cuda
