// CUDA backend of kernels/linear.h. Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db);

}  // namespace fanout::kernels::cuda
