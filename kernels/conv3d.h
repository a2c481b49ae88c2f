// 3-D convolution (cross-correlation, as PyTorch's Conv3d), groups = 1,
// dilation = 1, over (N, C, D, H, W). CPU: oneDNN (kernels/cpu/conv.cpp).
// CUDA: cuDNN's N-d convolution.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// The same stride and padding on all three axes.
struct Conv3dGeometry {
  int64_t stride = 1;
  int64_t padding = 0;
};

// Output shape for x (N, C, D, H, W) and w (OC, C, KD, KH, KW); throws on impossible shapes.
Shape conv3d_output_shape(const Shape& x, const Shape& w, const Conv3dGeometry& g);

FANOUT_KERNEL_OPS(
// y (N, OC, OD, OH, OW) is written (=); b (OC) or null.
void conv3d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv3dGeometry& g,
                    Tensor& y);
// dx (=) when non-null; dw (+=) when defined; db (+=) when non-null.
void conv3d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv3dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db);
)

}  // namespace fanout::kernels
