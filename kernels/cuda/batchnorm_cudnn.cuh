// cuDNN's fused batch normalization graphs (kernels/cuda/batchnorm_cudnn.cu)
// for the CUDA batch-norm ops (kernels/cuda/batchnorm.cu), which run their
// own kernels when these return false: not applicable or refused, nothing
// written.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

// Training forward y = relu(bn(x) + z) (z may be null) with the batch
// statistics and the running statistics' update: mean (2, C) gets the
// batch mean in row 0 and zeros in row 1, invstd (C) 1 / sqrt(var + eps).
// With `mask` (U8, at least ceil(numel / 8) bytes) the graph also writes the
// ReLU's bit mask there when cuDNN builds that graph: mask_written says so.
bool cudnn_bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma,
                             const Tensor& beta, float eps, float momentum, Tensor& mean, Tensor& invstd,
                             Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor* mask, bool& mask_written);

// Bytes of bit mask the forward can write for x: ceil(numel / 8) when x's
// shape and storage are ones these graphs take (and they are on), else 0.
int64_t cudnn_bn_mask_bytes(const Tensor& x);

// Its backward: g = dy where y > 0 (g may alias dy), grad_stats (2, C) =
// (sum g, sum g * xhat), dx. `mask`: the forward's bit mask where it wrote
// one (else null: the ReLU's backward reads y).
bool cudnn_bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                            const Tensor& invstd, const Tensor& gamma, const Tensor* mask, Tensor& grad_stats,
                            Tensor& g, Tensor& dx);

}  // namespace fanout::kernels::cuda
