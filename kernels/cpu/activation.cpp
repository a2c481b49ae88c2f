// CPU activations: elementwise loops (ReLU branch-free, so g++ -O3
// vectorizes it, also for AVX2; the smooth ones call libm per element).
#include "kernels/activation.h"

#include "kernels/activation_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

namespace {
FANOUT_AVX2_CLONE void relu_rows(const float* x, float* y, int64_t n) {
  map1(x, y, n, [](float v) { return v < 0.0f ? 0.0f : v; });
}
FANOUT_AVX2_CLONE void relu_grad_rows(const float* y, const float* dy, float* dx, int64_t n) {
  map2(y, dy, dx, n, [](float yv, float g) { return yv > 0.0f ? g : 0.0f; });
}
}  // namespace

void relu_forward(Context& ctx, const Tensor& x, Tensor& y) {
  // y may alias x. NaN propagates (NaN < 0 is false), as torch.relu.
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, x.numel(), grain_for(1), [&](int64_t b, int64_t e) {
    relu_rows(xp + b, yp + b, e - b);
  });
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  // dx may alias dy (or y).
  const float *yp = y.f32(), *gp = dy.f32();
  float* dp = dx.f32();
  parallel_for(ctx, y.numel(), grain_for(1), [&](int64_t b, int64_t e) {
    relu_grad_rows(yp + b, gp + b, dp + b, e - b);
  });
}

}  // namespace fanout::kernels::cpu

namespace fanout::kernels::cpu {

namespace {
template <Act K>
void forward_as(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  const float slope = a.negative_slope;
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, x.numel(), grain_for(8), [&](int64_t b, int64_t e) {
    map1(xp + b, yp + b, e - b, [slope](float v) { return act::forward<K>(v, slope); });
  });
}
template <Act K>
void backward_as(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float slope = a.negative_slope;
  const float *xp = x.f32(), *gp = dy.f32();
  float* dp = dx.f32();
  parallel_for(ctx, x.numel(), grain_for(8), [&](int64_t b, int64_t e) {
    map2(xp + b, gp + b, dp + b, e - b, [slope](float v, float g) { return act::backward<K>(v, g, slope); });
  });
}
}  // namespace

void activation_forward(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  act::with_kind(a.kind, [&](auto k) { forward_as<decltype(k)::value>(ctx, a, x, y); });
}

void activation_backward(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  act::with_kind(a.kind, [&](auto k) { backward_as<decltype(k)::value>(ctx, a, x, dy, dx); });
}

}  // namespace fanout::kernels::cpu
