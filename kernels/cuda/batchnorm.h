// CUDA backend of kernels/batchnorm.h. Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void bn_stats(Context& ctx, const Tensor& x, Tensor& stats);
void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var);
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y);
void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats);
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx);

}  // namespace fanout::kernels::cuda
