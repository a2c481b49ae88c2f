// CUDA backend of kernels/conv2d.h (cuDNN). Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "kernels/conv2d.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                    Tensor& y);
void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db);

}  // namespace fanout::kernels::cuda
