// CPU backend of kernels/linear.h: GEMMs through OpenBLAS plus a bias loop.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db);

}  // namespace fanout::kernels::cpu
