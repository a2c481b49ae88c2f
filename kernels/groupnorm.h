// Group normalization (torch.nn.functional.group_norm): x (N, C, spatial...)
// is normalized over each (sample, group of C / groups channels) with the
// group's biased variance, then scaled and shifted per channel. Statistics
// are computed in double (two passes), the rest in float32. x, y, dy and dx
// may be float32, bfloat16 or float16 in either memory format (staged,
// kernels/staging.h).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// y (=) x's shape; mean and rstd (=) (N, groups): each group's mean and
// 1 / sqrt(var + eps), kept for backward. gamma, beta (C).
void group_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd);
// dx (=), which may alias dy; dgamma += sum over samples and positions of
// dy * xhat, dbeta += sum of dy. float64 dgamma/dbeta (split-invariant
// math, CPU): each sample's sum is rounded to float and added exactly.
void group_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, int groups, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
)

}  // namespace fanout::kernels
