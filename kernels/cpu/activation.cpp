// CPU activations: branch-free elementwise loops that g++ -O3 vectorizes.
#include "kernels/activation.h"

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
