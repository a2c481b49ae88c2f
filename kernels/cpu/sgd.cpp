// CPU SGD: one fused pass over the flat arena, torch.optim.SGD's update:
//   g = grad + wd * p; buf = first ? g : mu * buf + (1 - dampening) * g;
//   g = nesterov ? g + mu * buf : buf; p -= lr * g.
#include "kernels/sgd.h"

namespace fanout::kernels::cpu {

void sgd_step(Context&, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first) {
  const int64_t n = params.numel();
  float* p = params.f32();
  const float* g = grads.f32();
  const float lr = h.lr, wd = h.weight_decay, mu = h.momentum, damp = 1.0f - h.dampening;
  if (mu == 0.0f) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float* buf = momentum_buf.f32();
  if (first) {
    // torch: buf = clone(g) on the first step (no dampening).
    if (h.nesterov)
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * p[i];
        buf[i] = d;
        p[i] -= lr * (d + mu * d);
      }
    else
      for (int64_t i = 0; i < n; ++i) {
        const float d = g[i] + wd * p[i];
        buf[i] = d;
        p[i] -= lr * d;
      }
    return;
  }
  if (h.nesterov)
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * p[i];
      const float b = mu * buf[i] + damp * d;
      buf[i] = b;
      p[i] -= lr * (d + mu * b);
    }
  else
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * p[i];
      const float b = mu * buf[i] + damp * d;
      buf[i] = b;
      p[i] -= lr * b;
    }
}

}  // namespace fanout::kernels::cpu
