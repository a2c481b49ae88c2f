// CUDA backend of kernels/sgd.h. Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry point before this is called.
#pragma once
#include "kernels/sgd.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first);

}  // namespace fanout::kernels::cuda
