// CPU backend of kernels/sgd.h: one fused loop over the flat arena.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "kernels/sgd.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first);

}  // namespace fanout::kernels::cpu
