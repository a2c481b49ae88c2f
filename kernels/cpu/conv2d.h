// CPU backend of kernels/conv2d.h: im2col + GEMM per image, col2im for dx.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "kernels/conv2d.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                    Tensor& y);
void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db);

}  // namespace fanout::kernels::cpu
