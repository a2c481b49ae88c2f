// Pooling over the 2 or 3 trailing spatial axes of (N, C, H, W) or
// (N, C, D, H, W), one op family for both ranks (the rank an argument, as in
// kernels/conv.h): max pooling with argmax and average pooling
// (torch.nn.MaxPool2d/3d, AvgPool2d/3d: cubic window, floor mode; average with
// count_include_pad, so every window divides by kernel^rank), global average
// pooling (adaptive average pool to 1x1), and nearest 3-D upsampling by an
// integer factor (torch.nn.Upsample(scale_factor=s, mode='nearest')).
// Backends treat a 2-D pooling as a 3-D one with depth 1 and a window of 1
// along it. x, y, dy and dx may be float32, bfloat16 or float16 in either
// memory format (staged, kernels/staging.h); argmax is int32, contiguous.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// The same window on every spatial axis.
struct PoolGeometry {
  int64_t kernel = 2, stride = 2, padding = 0;
};

// Floor mode, as PyTorch's default, over the `spatial` (2 or 3) trailing
// axes of x; throws on impossible shapes.
Shape pool_output_shape(int spatial, const Shape& x, const PoolGeometry& g);
// How the backends walk a pooling from x to y: its (depth, row, column) axes,
// each with its input and output lengths and window; a 2-D pooling's depth
// axis has length 1 and a window of 1.
struct PoolAxes {
  int64_t len[3], out[3];
  PoolGeometry g[3];
  int64_t in_volume() const { return len[0] * len[1] * len[2]; }
  int64_t out_volume() const { return out[0] * out[1] * out[2]; }
  // Elements of a whole window (kernel^spatial): average pooling's divisor.
  int64_t window_elements() const { return g[0].kernel * g[1].kernel * g[2].kernel; }
};
PoolAxes pool_axes(int spatial, const Shape& x, const Shape& y, const PoolGeometry& g);

// (N, C, D*s, H*s, W*s) for x (N, C, D, H, W) and scale s >= 1.
Shape upsample3d_output_shape(const Shape& x, int64_t scale);

FANOUT_KERNEL_OPS(
// y (=); argmax (I32, same shape as y) holds the flat index ((d*H + h)*W + w,
// or h*W + w) of the max inside its (n, c) volume. First maximum wins, NaN
// propagates, padding is never selected.
void maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax);
// dx (=), scattered from dy through argmax.
void maxpool_backward(Context& ctx, int spatial, const Tensor& dy, const Tensor& argmax, Tensor& dx);

// y (=): each window's sum (padding counts as 0) / kernel^spatial, summed in
// (depth, row, column) order.
void avgpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y);
// dx (=): each input element gathers dy / kernel^spatial of the windows that
// hold it, in (depth, row, column) order of the outputs (no atomics on CUDA).
void avgpool_backward(Context& ctx, int spatial, const Tensor& dy, const PoolGeometry& g, Tensor& dx);

// x (N, C, H, W) -> y (N, C, 1, 1), written (=).
void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y);
void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx);

// y[n, c, d, h, w] = x[n, c, d/s, h/s, w/s], written (=).
void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y);
// dx (=): each input element gets the sum of the s^3 gradients it was copied
// to, in (depth, row, column) order.
void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx);
)

}  // namespace fanout::kernels
