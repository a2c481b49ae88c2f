// 2-D convolution (cross-correlation, as PyTorch), groups = 1, dilation = 1.
// CPU: oneDNN (kernels/cpu/conv.cpp). CUDA: cuDNN.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

struct Conv2dGeometry {
  int64_t stride = 1;
  int64_t padding = 0;
};

// Output shape for x (N, C, H, W) and w (OC, C, KH, KW); throws on impossible shapes.
Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dGeometry& g);

FANOUT_KERNEL_OPS(
// y (N, OC, OH, OW) is written (=); b (OC) or null.
void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                    Tensor& y);
// dx (=) when non-null; dw (+=) when defined; db (+=) when non-null.
void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db);
)

}  // namespace fanout::kernels
