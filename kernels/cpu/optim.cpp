// CPU optimizer kernels: one pass over each chunk of the table, torch's
// update rules (kernels/optim.h), float32 arithmetic in the order of torch's
// CPU kernels (lerp, mul then addcmul, sqrt, div, add, addcdiv).
#include "kernels/optim.h"

#include <algorithm>
#include <cmath>

namespace fanout::kernels::cpu {

namespace {
template <class F>
void for_chunks(const Tensor& chunks, F&& f) {
  const int64_t* c = chunks.data<int64_t>();
  for (int64_t k = 0; k < chunks.size(0); ++k) f(c[2 * k], c[2 * k] + c[2 * k + 1]);
}
}  // namespace

void sgd_step(Context&, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const Tensor& chunks,
              const SgdStep& h) {
  float* p = params.f32();
  const float* g = grads.f32();
  float* buf = h.momentum != 0.0f ? momentum_buf.f32() : nullptr;
  const float lr = h.lr, wd = h.weight_decay, mu = h.momentum, damp = 1.0f - h.dampening;
  for_chunks(chunks, [&](int64_t b, int64_t e) {
    if (!buf) {
      for (int64_t i = b; i < e; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      return;
    }
    for (int64_t i = b; i < e; ++i) {
      const float d = g[i] + wd * p[i];
      const float m = h.first ? d : mu * buf[i] + damp * d;  // torch: buf = clone(d) on the first step
      buf[i] = m;
      p[i] -= lr * (h.nesterov ? d + mu * m : m);
    }
  });
}

namespace {
// One chunk of the Adam update; the branches are template parameters so
// that the loop vectorizes (restrict: the arenas never alias).
template <bool kAmsgrad, bool kLowWeight>
void adam_range(float* __restrict p, const float* __restrict gr, float* __restrict m, float* __restrict v,
                float* __restrict vmax, int64_t b, int64_t e, const AdamStep& h) {
  const float w = h.one_minus_beta1, decay = h.decay, wd = h.weight_decay, beta2 = h.beta2;
  const float omb2 = h.one_minus_beta2, eps = h.eps, step = h.step_size, bc2 = h.bias_correction2_sqrt;
  for (int64_t i = b; i < e; ++i) {
    const float pi = p[i] * decay;
    const float g = gr[i] + wd * pi;
    // torch.lerp: start + w * (end - start) for w < 0.5, else end - (end - start) * (1 - w).
    const float mi = kLowWeight ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.0f - w);
    const float vi = beta2 * v[i] + omb2 * g * g;  // addcmul: (value * g) * g
    float vd = vi;
    if constexpr (kAmsgrad) {
      vd = vmax[i] < vi ? vi : vmax[i];
      vmax[i] = vd;
    }
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step * (mi / (std::sqrt(vd) / bc2 + eps));
  }
}
}  // namespace

void adam_step(Context&, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h) {
  float* p = params.f32();
  const float* g = grads.f32();
  float* m = exp_avg.f32();
  float* v = exp_avg_sq.f32();
  float* vmax = h.amsgrad ? max_exp_avg_sq.f32() : nullptr;
  const bool low = h.one_minus_beta1 < 0.5f;
  for_chunks(chunks, [&](int64_t b, int64_t e) {
    if (h.amsgrad) {
      low ? adam_range<true, true>(p, g, m, v, vmax, b, e, h) : adam_range<true, false>(p, g, m, v, vmax, b, e, h);
    } else {
      low ? adam_range<false, true>(p, g, m, v, vmax, b, e, h) : adam_range<false, false>(p, g, m, v, vmax, b, e, h);
    }
  });
}

// Eight running sums (element i goes to sum i % 8), added at the end: a
// fixed order, so the result does not depend on anything but the data, and
// one the compiler can vectorize.
double sum_squares(Context&, const Tensor& x) {
  const float* a = x.f32();
  const int64_t n = x.numel(), body = n / 8 * 8;
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < body; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += static_cast<double>(a[i + k]) * a[i + k];
  for (int64_t i = body; i < n; ++i) s[i - body] += static_cast<double>(a[i]) * a[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void clamp_abs(Context&, Tensor& x, float limit) {
  float* a = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i)
    if (a[i] > limit) a[i] = limit;
    else if (a[i] < -limit) a[i] = -limit;
}

}  // namespace fanout::kernels::cpu
