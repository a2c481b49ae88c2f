// Optimizer updates and gradient reductions over flat arenas: one fused
// kernel per parameter group and step (the group's ranges of the arena come
// as a chunk table), the sum of squares behind clipping by norm, and the
// clamp behind clipping by value. The update rules are torch.optim's,
// stated beside each step's arguments; the host computes every scalar that
// depends only on hyper-parameters and the step count (in double, rounded
// once), as torch's Python does.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// A chunk table: (begin, length) pairs of elements of a flat arena, an I64
// tensor (K, 2) on the arena's device, each length in 1..kUpdateChunk.
inline constexpr int64_t kUpdateChunk = 16384;

// torch.optim.SGD, per element:
//   d = grad + weight_decay * p
//   buf = first ? d : momentum * buf + (1 - dampening) * d   (momentum != 0)
//   u = nesterov ? d + momentum * buf : buf                  (momentum != 0; else u = d)
//   p -= lr * u
struct SgdStep {
  float lr = 0, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
  bool first = false;  // the momentum buffer does not exist yet (torch's None)
};

// torch.optim.Adam / AdamW (single-tensor path), per element, step t >= 1:
//   AdamW: p *= decay (= 1 - lr * weight_decay)   Adam: g = grad + weight_decay * p
//   m = lerp(m, g, one_minus_beta1)
//   v = beta2 * v + one_minus_beta2 * g * g
//   vmax = max(vmax, v) (amsgrad; the denominator then uses vmax)
//   p -= step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// with step_size = lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t).
struct AdamStep {
  float weight_decay = 0;  // coupled (Adam); 0 for AdamW
  float decay = 1;         // decoupled (AdamW); 1 for Adam
  float one_minus_beta1 = 0.1f, beta2 = 0.999f, one_minus_beta2 = 0.001f, eps = 1e-8f;
  float step_size = 0, bias_correction2_sqrt = 1;
  bool amsgrad = false;
};

FANOUT_KERNEL_OPS(
// params, grads and the state arenas: float32, same numel; `chunks` says
// which elements. momentum_buf is untouched when momentum == 0;
// max_exp_avg_sq when !amsgrad (either may then be undefined).
void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const Tensor& chunks,
              const SgdStep& h);
void adam_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h);
// The sum of x's squares (x float32), accumulated in double; waits for it.
// A non-finite element makes the sum non-finite.
double sum_squares(Context& ctx, const Tensor& x);
// x = clamp(x, -limit, limit) (float32; NaN stays NaN, as torch.clamp).
void clamp_abs(Context& ctx, Tensor& x, float limit);
)

}  // namespace fanout::kernels
