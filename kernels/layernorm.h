// Layer normalization (torch.nn.functional.layer_norm): x viewed as (rows,
// d), d = gamma.numel() (the normalized shape's elements, x's last dims),
// each row normalized with its biased variance, then scaled and shifted
// elementwise over d. Statistics in double (two passes), the rest in
// float32, as kernels/groupnorm.h. x, y, dy and dx may be float32, bfloat16
// or float16 in either memory format (staged, kernels/staging.h).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// y (=) x's shape; mean and rstd (=) (rows): each row's mean and
// 1 / sqrt(var + eps), kept for backward. gamma, beta (d).
void layer_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd);
// dx (=), which may alias dy; dgamma += sum over rows of dy * xhat, dbeta
// += sum of dy. float64 dgamma/dbeta (split-invariant math, CPU): each
// sample's (x.size(0)) sum is rounded to float and added exactly.
void layer_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta);
)

}  // namespace fanout::kernels
