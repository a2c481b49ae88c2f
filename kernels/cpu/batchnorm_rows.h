// CPU batch normalization over channels-last tensors of any floating storage
// (float32, bfloat16, float16; NHWC, NDHWC), read and written as stored:
// kernels/cpu/batchnorm.cpp hands such tensors here and keeps float32
// contiguous ones. The arithmetic is the plane kernels' (float64 sums about
// the channel's first value, float32 passes), on (R, C) rows of C channels.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu::rows {

void bn_stats(Context& ctx, const Tensor& x, Tensor& stats);
// y = ((x - hi) - lo) * (invstd * gamma) + beta, rounded to autocast's type
// when it is on, stored in y's type.
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y);
void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round);
void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y);
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats);
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx);

}  // namespace fanout::kernels::cpu::rows
