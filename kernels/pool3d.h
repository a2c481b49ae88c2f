// Volumetric pooling and resampling over (N, C, D, H, W): max and average
// pooling (torch.nn.MaxPool3d / AvgPool3d: cubic window, floor mode; average
// with count_include_pad, so every window divides by kernel^3) and nearest
// upsampling by an integer factor (torch.nn.Upsample(scale_factor=s,
// mode='nearest')).
#pragma once
#include "kernels/declare.h"
#include "kernels/pool.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// PoolGeometry (kernels/pool.h) applies to all three axes alike (pool_output_shape).
inline Shape pool3d_output_shape(const Shape& x, const PoolGeometry& g) { return pool_output_shape(3, x, g); }
// (N, C, D*s, H*s, W*s) for x (N, C, D, H, W) and scale s >= 1.
Shape upsample3d_output_shape(const Shape& x, int64_t scale);

FANOUT_KERNEL_OPS(
// y (=); argmax (I32, same shape as y) holds the flat index (d*H + h)*W + w of
// the max inside each (D, H, W) volume. First maximum wins, NaN propagates,
// padding is never selected.
void maxpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax);

// y (=): each window's sum over the volume (padding counts as 0) / kernel^3,
// summed in (depth, row, column) order.
void avgpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y);
// dx (=): each input element gathers dy / kernel^3 of the windows that hold
// it, in (depth, row, column) order of the outputs (no atomics on CUDA).
void avgpool3d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx);

// y[n, c, d, h, w] = x[n, c, d/s, h/s, w/s], written (=).
void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y);
// dx (=): each input element gets the sum of the s^3 gradients it was copied to.
void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx);
)

// dx (=), scattered from dy through argmax: maxpool2d_backward on (N, C, S, 1)
// views of the volumes, since the scatter does not depend on the rank.
void maxpool3d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx);

}  // namespace fanout::kernels
