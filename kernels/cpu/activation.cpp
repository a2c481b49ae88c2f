// CPU activations: elementwise loops (ReLU branch-free, so g++ -O3
// vectorizes it, also for AVX2). GELU's erf and exp are branch-free
// polynomials that vectorize the same way (kernels/cpu/poly_math.h); the
// other smooth ones call libm per element.
#include "kernels/activation.h"

#include <cstdint>

#include "kernels/activation_math.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/poly_math.h"
#include "kernels/cpu/storage.h"

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
  storage_map1(ctx, x, y, 1, [](const float* xp, float* yp, int64_t n) { relu_rows(xp, yp, n); });
}

void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  // dx may alias dy (or y).
  storage_map2(ctx, y, dy, dx, 1,
               [](const float* yp, const float* gp, float* dp, int64_t n) { relu_grad_rows(yp, gp, dp, n); });
}

}  // namespace fanout::kernels::cpu

namespace fanout::kernels::cpu {

namespace {

// y may alias x, dx dy.
FANOUT_AVX2_CLONE void gelu_rows(const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + erf_poly(v * 0.70710678118654752f));
  }
}
FANOUT_AVX2_CLONE void gelu_grad_rows(const float* x, const float* dy, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i], u = v * 0.70710678118654752f;
    const float e = exp_poly(-u * u);  // exp(-v^2 / 2): erf's and the density's
    const float cdf = 0.5f * (1.0f + erf_poly_given(u, e));
    const float pdf = 0.39894228040143268f * e;
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

template <Act K>
void forward_as(Context& ctx, const Activation& a, const Tensor& x, Tensor& y) {
  const float slope = a.negative_slope;
  storage_map1(ctx, x, y, 8, [slope](const float* xp, float* yp, int64_t n) {
    if constexpr (K == Act::Gelu) gelu_rows(xp, yp, n);
    else map1(xp, yp, n, [slope](float v) { return act::forward<K>(v, slope); });
  });
}

template <Act K>
void backward_as(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float slope = a.negative_slope;
  storage_map2(ctx, x, dy, dx, 8, [slope](const float* xp, const float* gp, float* dp, int64_t n) {
    if constexpr (K == Act::Gelu) gelu_grad_rows(xp, gp, dp, n);
    else map2(xp, gp, dp, n, [slope](float v, float g) { return act::backward<K>(v, g, slope); });
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
