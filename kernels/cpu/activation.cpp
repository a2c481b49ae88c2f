// CPU activations: elementwise loops (ReLU branch-free, so g++ -O3
// vectorizes it; the smooth ones call libm per element).
#include "kernels/activation.h"

#include "kernels/activation_math.h"
#include "kernels/cpu/loops.h"

namespace fanout::kernels::cpu {

void relu_forward(Context&, const Tensor& x, Tensor& y) {
  // y may alias x. NaN propagates (NaN < 0 is false), as torch.relu.
  map1(x.f32(), y.f32(), x.numel(), [](float v) { return v < 0.0f ? 0.0f : v; });
}

void relu_backward(Context&, const Tensor& y, const Tensor& dy, Tensor& dx) {
  // dx may alias dy (or y).
  map2(y.f32(), dy.f32(), dx.f32(), y.numel(), [](float yv, float g) { return yv > 0.0f ? g : 0.0f; });
}

}  // namespace fanout::kernels::cpu

namespace fanout::kernels::cpu {

namespace {
template <Act K>
void forward_as(const Activation& a, const Tensor& x, Tensor& y) {
  const float slope = a.negative_slope;
  map1(x.f32(), y.f32(), x.numel(), [slope](float v) { return act::forward<K>(v, slope); });
}
template <Act K>
void backward_as(const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float slope = a.negative_slope;
  map2(x.f32(), dy.f32(), dx.f32(), x.numel(), [slope](float v, float g) { return act::backward<K>(v, g, slope); });
}
}  // namespace

void activation_forward(Context&, const Activation& a, const Tensor& x, Tensor& y) {
  switch (a.kind) {
    case Act::Tanh: return forward_as<Act::Tanh>(a, x, y);
    case Act::Sigmoid: return forward_as<Act::Sigmoid>(a, x, y);
    case Act::Gelu: return forward_as<Act::Gelu>(a, x, y);
    case Act::Silu: return forward_as<Act::Silu>(a, x, y);
    case Act::LeakyRelu: return forward_as<Act::LeakyRelu>(a, x, y);
  }
}

void activation_backward(Context&, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  switch (a.kind) {
    case Act::Tanh: return backward_as<Act::Tanh>(a, x, dy, dx);
    case Act::Sigmoid: return backward_as<Act::Sigmoid>(a, x, dy, dx);
    case Act::Gelu: return backward_as<Act::Gelu>(a, x, dy, dx);
    case Act::Silu: return backward_as<Act::Silu>(a, x, dy, dx);
    case Act::LeakyRelu: return backward_as<Act::LeakyRelu>(a, x, dy, dx);
  }
}

}  // namespace fanout::kernels::cpu
