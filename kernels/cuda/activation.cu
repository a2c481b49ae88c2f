// CUDA activations; CPU counterparts in kernels/cpu/activation.cpp.
#include "kernels/activation.h"

#include "kernels/activation_math.h"
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
  detail::launch_map1(ctx, ActForward<K>{a.negative_slope}, x.f32(), y.f32(), x.numel());
}
template <Act K>
void backward_as(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  detail::launch_map2(ctx, ActBackward<K>{a.negative_slope}, x.f32(), dy.f32(), dx.f32(), x.numel());
}
}  // namespace

void activation_forward(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  detail::DeviceScope scope(ctx);
  switch (a.kind) {
    case Act::Tanh: return forward_as<Act::Tanh>(ctx, a, x, y);
    case Act::Sigmoid: return forward_as<Act::Sigmoid>(ctx, a, x, y);
    case Act::Gelu: return forward_as<Act::Gelu>(ctx, a, x, y);
    case Act::Silu: return forward_as<Act::Silu>(ctx, a, x, y);
    case Act::LeakyRelu: return forward_as<Act::LeakyRelu>(ctx, a, x, y);
  }
}

void activation_backward(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  detail::DeviceScope scope(ctx);
  switch (a.kind) {
    case Act::Tanh: return backward_as<Act::Tanh>(ctx, a, x, dy, dx);
    case Act::Sigmoid: return backward_as<Act::Sigmoid>(ctx, a, x, dy, dx);
    case Act::Gelu: return backward_as<Act::Gelu>(ctx, a, x, dy, dx);
    case Act::Silu: return backward_as<Act::Silu>(ctx, a, x, dy, dx);
    case Act::LeakyRelu: return backward_as<Act::LeakyRelu>(ctx, a, x, dy, dx);
  }
}

}  // namespace fanout::kernels::cuda
