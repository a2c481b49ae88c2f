// Pooling over (N, C, H, W): max, average (count_include_pad = true, as
// PyTorch's default), and global average (adaptive average pool to 1x1).
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

struct PoolGeometry {
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t padding = 0;
};

// Floor mode, as PyTorch's default, over the `spatial` (2 or 3) trailing
// axes of x; throws on impossible shapes.
Shape pool_output_shape(int spatial, const Shape& x, const PoolGeometry& g);
inline Shape pool2d_output_shape(const Shape& x, const PoolGeometry& g) { return pool_output_shape(2, x, g); }

FANOUT_KERNEL_OPS(
// y (=); argmax (I32, same shape as y) holds the flat index h*W+w of the max inside each plane.
void maxpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax);
// dx (=), scattered from dy through argmax.
void maxpool2d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx);

void avgpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y);
void avgpool2d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx);

// x (N, C, H, W) -> y (N, C, 1, 1), written (=).
void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y);
void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx);
)

}  // namespace fanout::kernels
