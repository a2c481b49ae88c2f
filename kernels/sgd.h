// One fused SGD step over a flat parameter arena, exactly torch.optim.SGD:
//   g = grad + weight_decay * p
//   buf = first ? g : momentum * buf + (1 - dampening) * g   (when momentum != 0)
//   g = nesterov ? g + momentum * buf : buf                  (when momentum != 0)
//   p -= lr * g
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

struct SgdHyper {
  float lr = 0.1f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

FANOUT_KERNEL_OPS(
// params, grads, momentum_buf: same numel, float32; momentum_buf unused when momentum == 0.
// `first`: the momentum buffer does not exist yet (torch's "None").
void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first);
)

}  // namespace fanout::kernels
