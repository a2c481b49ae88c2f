// Per-channel bias of (N, C, ...) tensors, for layers whose convolution has
// no bias of its own (the transposed convolutions): the add and its
// gradient. CPU: kernels/cpu/conv_bias.cpp; CUDA: kernels/cuda/conv.cu
// (the convolutions' own bias kernels). y and dy may be float32, bfloat16 or
// float16 in either memory format (staged, kernels/staging.h).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// y (N, C, ...) += b[c].
void channel_bias_add(Context& ctx, Tensor& y, const Tensor& b);
// db (C) += the sum of dy (N, C, ...) over samples and positions, in double;
// float64 db (split-invariant math, CPU): each sample's sum rounded to float
// and added exactly.
void channel_bias_grad(Context& ctx, const Tensor& dy, Tensor& db);
)

}  // namespace fanout::kernels
