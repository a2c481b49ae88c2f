// Batch normalization over (N, H, W) per channel, split into the steps that
// SyncBatchNorm needs: local statistics, finalize (after an optional
// all-reduce of the statistics), apply; and the same for backward.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// x (N, C, H, W) or (N, C). stats (2, C) is written (=): row 0 sum of x, row 1 sum of x^2.
void bn_stats(Context& ctx, const Tensor& x, Tensor& stats);

// From summed statistics over `count` elements per channel: mean (C) and
// invstd (C) = 1/sqrt(biased var + eps) are written. When running stats are
// given they are updated as PyTorch does:
//   running = (1 - momentum) * running + momentum * batch, using the unbiased
//   variance count/(count-1) * var for running_var.
void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var);

// y = (x - mean) * invstd * gamma + beta, written (=).
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y);

// Eval mode: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta.
void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);

// grad_stats (2, C) is written (=): row 0 sum of dy, row 1 sum of dy * xhat,
// where xhat = (x - mean) * invstd.
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats);

// dx (=) from the (possibly all-reduced) grad_stats over `count` elements:
// dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx);

}  // namespace fanout::kernels
