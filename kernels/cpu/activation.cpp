// CPU activations: branch-free elementwise loops that g++ -O3 vectorizes.
#include "kernels/cpu/activation.h"

namespace fanout::kernels::cpu {

void relu_forward(Context&, const Tensor& x, Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();  // may alias xp
  const int64_t n = x.numel();
  // NaN propagates (NaN < 0 is false), as torch.relu.
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] < 0.0f ? 0.0f : xp[i];
}

void relu_backward(Context&, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const float* yp = y.f32();
  const float* gp = dy.f32();
  float* dp = dx.f32();  // may alias gp
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) dp[i] = yp[i] > 0.0f ? gp[i] : 0.0f;
}

}  // namespace fanout::kernels::cpu
