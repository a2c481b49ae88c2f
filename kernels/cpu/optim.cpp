// CPU optimizer kernels: one pass over each chunk of the table, torch's
// update rules (kernels/optim.h), float32 arithmetic in the order of torch's
// CPU kernels (lerp, mul then addcmul, sqrt, div, add, addcdiv). Elements are
// split over the context's threads; no result depends on their number.
#include "kernels/optim.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

namespace {
// f(begin, end) over each chunk (at most kUpdateChunk elements), the chunks cut over the threads.
template <class F>
void for_chunks(const Context& ctx, const Tensor& chunks, F&& f) {
  const int64_t* c = chunks.data<int64_t>();
  parallel_for(ctx, chunks.size(0), 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) f(c[2 * k], c[2 * k] + c[2 * k + 1]);
  });
}
}  // namespace

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const Tensor& chunks,
              const SgdStep& h) {
  float* p = params.f32();
  const float* g = grads.f32();
  float* buf = h.momentum != 0.0f ? momentum_buf.f32() : nullptr;
  const float lr = h.lr, wd = h.weight_decay, mu = h.momentum, damp = 1.0f - h.dampening;
  for_chunks(ctx, chunks, [&](int64_t b, int64_t e) {
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

void adam_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h) {
  float* p = params.f32();
  const float* g = grads.f32();
  float* m = exp_avg.f32();
  float* v = exp_avg_sq.f32();
  float* vmax = h.amsgrad ? max_exp_avg_sq.f32() : nullptr;
  const bool low = h.one_minus_beta1 < 0.5f;
  for_chunks(ctx, chunks, [&](int64_t b, int64_t e) {
    if (h.amsgrad) {
      low ? adam_range<true, true>(p, g, m, v, vmax, b, e, h) : adam_range<true, false>(p, g, m, v, vmax, b, e, h);
    } else {
      low ? adam_range<false, true>(p, g, m, v, vmax, b, e, h) : adam_range<false, false>(p, g, m, v, vmax, b, e, h);
    }
  });
}

namespace {
// Sixteen running sums (element i goes to sum i % 16), added pairwise at the
// end: a fixed order the compiler vectorizes.
double sum_squares_range(const float* a, int64_t n) {
  constexpr int kLanes = 16;
  const int64_t body = n / kLanes * kLanes;
  double s[kLanes] = {};
  for (int64_t i = 0; i < body; i += kLanes)
    for (int k = 0; k < kLanes; ++k) s[k] += static_cast<double>(a[i + k]) * a[i + k];
  for (int64_t i = body; i < n; ++i) s[i - body] += static_cast<double>(a[i]) * a[i];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) s[k] += s[k + w];
  return s[0];
}
}  // namespace

// The tensor is cut into at most kBlocks blocks whose size depends on numel
// alone; the blocks' sums (computed by any thread) are added in block order,
// so the result depends on the data only, never on the thread count.
double sum_squares(Context& ctx, const Tensor& x) {
  constexpr int64_t kBlocks = 64, kMinBlock = int64_t{1} << 16;
  const float* a = x.f32();
  const int64_t n = x.numel();
  const int64_t block = std::max(kMinBlock, (n + kBlocks - 1) / kBlocks);
  const int64_t blocks = (n + block - 1) / block;
  double part[kBlocks] = {};
  parallel_for(ctx, blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) part[k] = sum_squares_range(a + k * block, std::min(block, n - k * block));
  });
  double total = 0;
  for (int64_t k = 0; k < blocks; ++k) total += part[k];
  return total;
}

void clamp_abs(Context& ctx, Tensor& x, float limit) {
  float* a = x.f32();
  parallel_for(ctx, x.numel(), grain_for(1), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (a[i] > limit) a[i] = limit;
      else if (a[i] < -limit) a[i] = -limit;
  });
}

}  // namespace fanout::kernels::cpu
