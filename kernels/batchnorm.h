// Batch normalization per channel of (N, C, ...) inputs, split into the steps
// that SyncBatchNorm needs: local statistics, finalize (after an optional
// all-reduce of the statistics), apply; and the same for backward.
//
// Stability: a channel whose mean is large against its spread (offset 1e4,
// spread 1) must not lose its variance to cancellation. The statistics are
// float64 and hold the sum of squared deviations from the local mean
// (shifted sums about the channel's first value: one pass), plus what
// merging replicas needs (Chan et al.): summing the rows over replicas and
// finalizing gives the exact pooled variance up to float64 rounding. The
// mean is kept as an unevaluated sum of two floats (hi + lo), so x - mean is
// taken to float64 accuracy: one float would be off by half an ulp of the
// offset, 5e-4 at 1e4.
//
// Autocast (ctx.math.autocast BF16 or F16): statistics and arithmetic stay
// float32, and bn_apply, bn_forward_eval and bn_backward_apply write y and dx
// in their own type: rounded to a low one as stored, a float32 y or dx (a
// float32 input's) not rounded, as torch runs batch_norm in its input's type.
// x, y, dy and dx may be float32, bfloat16 or float16 in either memory
// format (staged, kernels/staging.h); statistics and parameters are float32
// (float64 batch statistics).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// x (N, C), (N, C, H, W) or (N, C, D, H, W). stats (3, C) float64 is written
// (=), per channel over the n = N * H * W (or N * D * H * W) local values:
// row 0 sum x, row 1 sum (x - m)^2 with m = sum x / n the local mean, row 2
// (sum x)^2 / n. Rows add over replicas.
void bn_stats(Context& ctx, const Tensor& x, Tensor& stats);

// From statistics summed over replicas, `count` elements per channel in all:
// mean (2, C) = (hi, lo) with hi + lo the mean, and invstd (C) =
// 1/sqrt(biased var + eps) are written, where var = (row 1 + row 2 - row 0^2 /
// count) / count. When running stats are given they are updated as PyTorch
// does: running = (1 - momentum) * running + momentum * batch, using the
// unbiased variance count/(count-1) * var for running_var.
void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var);

// y = (x - mean) * invstd * gamma + beta, written (=); mean (2, C) as bn_finalize writes it.
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y);

// Training forward of batch norm, then optionally a residual z added, then a
// ReLU, in one pass: y = max(bn_apply(x) + z, 0) written (=), z may be null;
// y may alias x or z. The value is rounded to `round` (F32 or a low type; y's
// own type when y is stored low) after the normalization and after the add,
// where the unfused layers store it: with round = y's type, the bits of
// bn_apply, add(..., round) and relu_forward in turn.
void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round = DType::F32);

// Batch norm's whole training forward with the residual add and ReLU, on
// one device's batch (no synchronized statistics): bn_stats into `stats`
// (3, C) float64, bn_finalize updating the running statistics, then
// bn_apply_add_relu (see there). CUDA runs it as one cuDNN graph
// (kernels/cuda/batchnorm_cudnn.cu) for 4-D bfloat16 or float16
// channels-last tensors when cuDNN has an engine for the shape: float32
// statistics, `stats` not written, the sum not rounded before the ReLU
// (results within the low type's roundings of the split kernels'), mean
// row 1 zero; otherwise, and on the CPU, the three steps. `relu_mask`
// (optional U8 scratch of bn_relu_mask_bytes(ctx, x) bytes): where the graph
// may keep the ReLU's bit mask for bn_backward_relu; returns whether it did.
bool bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma, const Tensor& beta,
                       float eps, float momentum, Tensor& stats, Tensor& mean, Tensor& invstd,
                       Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor* relu_mask,
                       DType round = DType::F32);

// The bytes of relu_mask scratch bn_train_add_relu can use for x on this
// device: ceil(numel / 8) where cuDNN's graphs may take x, else 0 (no mask).
int64_t bn_relu_mask_bytes(const Context& ctx, const Tensor& x);

// Eval mode: y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta.
void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);

// grad_stats (2, C) is written (=): row 0 sum of dy, row 1 sum of dy * xhat,
// where xhat = (x - mean) * invstd; mean (2, C) as bn_finalize writes it.
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats);

// The backward of a ReLU after batch norm (bn_apply_add_relu): g = dy where
// y > 0, else 0, is written (=) (g may alias dy: the masked gradient, which
// is also z's), and grad_stats (2, C) as bn_backward_reduce(x, g) writes it.
// The bits of relu_backward then bn_backward_reduce; one pass.
void bn_backward_reduce_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                             const Tensor& invstd, Tensor& grad_stats, Tensor& g);

// The backward of bn_train_add_relu (no synchronized statistics):
// bn_backward_reduce_relu (g, which may alias dy, and grad_stats), then
// bn_backward_apply of g over this batch into dx. CUDA runs it as one cuDNN
// graph where bn_train_add_relu can, else the two steps. relu_mask: the
// forward's, when bn_train_add_relu said it wrote it; else null.
void bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                      const Tensor& invstd, const Tensor& gamma, const Tensor* relu_mask, Tensor& grad_stats,
                      Tensor& g, Tensor& dx);

// dx (=) from the (possibly all-reduced) grad_stats over `count` elements:
// dx = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx);
)

}  // namespace fanout::kernels
