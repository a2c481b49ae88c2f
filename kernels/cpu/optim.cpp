// CPU optimizer kernels: one pass over each chunk of the table, torch's
// update rules (kernels/optim.h), float32 arithmetic in torch's order.
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

void adam_step(Context&, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h) {
  float* p = params.f32();
  const float* gr = grads.f32();
  float* m = exp_avg.f32();
  float* v = exp_avg_sq.f32();
  float* vmax = h.amsgrad ? max_exp_avg_sq.f32() : nullptr;
  const float w = h.one_minus_beta1;
  for_chunks(chunks, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float pi = p[i] * h.decay;
      const float g = gr[i] + h.weight_decay * pi;
      // torch.lerp: start + w * (end - start) for w < 0.5, else end - (end - start) * (1 - w).
      const float mi = w < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.0f - w);
      const float vi = h.beta2 * v[i] + h.one_minus_beta2 * (g * g);
      float vd = vi;
      if (vmax) {
        vd = std::max(vmax[i], vi);
        vmax[i] = vd;
      }
      m[i] = mi;
      v[i] = vi;
      p[i] = pi - h.step_size * (mi / (std::sqrt(vd) / h.bias_correction2_sqrt + h.eps));
    }
  });
}

double sum_squares(Context&, const Tensor& x) {
  const float* a = x.f32();
  double s = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(a[i]) * a[i];
  return s;
}

void clamp_abs(Context&, Tensor& x, float limit) {
  float* a = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i)
    if (a[i] > limit) a[i] = limit;
    else if (a[i] < -limit) a[i] = -limit;
}

}  // namespace fanout::kernels::cpu
