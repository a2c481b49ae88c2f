// Landmark heatmaps: CenterNet's draw_gaussian in 2D and 3D, the regression
// targets of landmark / keypoint detection.
//
// Each landmark draws a Gaussian of radius r voxels into its channel:
//   c    = floor(coord + 0.5) per axis, the landmark's voxel (coord in voxel units)
//   g(v) = exp(-|v - c|^2 / (2 sigma^2)) on the (2r+1)^dims window |v_i - c_i| <= r,
//          sigma = (2r+1) / 6 unless given; g(c) = 1 (the peak)
//   g below FLT_EPSILON * peak is 0, so is everything outside the window,
// clipped at the volume's borders (a landmark outside the volume still draws
// the part of its window inside it) and merged into the channel by elementwise
// maximum. Radius 0 is one voxel of value 1.
//
// g is evaluated as the product of its per-axis factors, each
// float(exp(-d^2 / (2 sigma^2))) computed in double, multiplied in float in
// axis order (z, y, x): that is what makes the separable (outer product)
// loops exact. Its relative error against exp(-|d|^2 / (2 sigma^2)) is below
// 5 * 2^-24 (three factor roundings, two products). Every renderer below, on
// every backend, gives the same bits.
#pragma once
#include <vector>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// Largest radius accepted (the window is (2r+1) voxels per axis).
inline constexpr int kMaxHeatmapRadius = 1 << 16;

struct HeatmapParams {
  int radius = 2;    // in [0, kMaxHeatmapRadius]; 0 draws one voxel of value 1
  double sigma = 0;  // in voxels, finite; 0: (2 * radius + 1) / 6
};

// The Gaussian's sigma: p.sigma, or the default when it is 0.
double heatmap_sigma(const HeatmapParams& p);

// The per-axis factors f[|d|] = float(exp(-d^2 / (2 sigma^2))), computed in
// double on the host, for |d| = 0..radius (f[0] = 1); the CUDA backend draws
// with this table.
std::vector<float> heatmap_axis_factors(const HeatmapParams& p);

FANOUT_KERNEL_OPS(
// A batch on the context's device.
// landmarks (N, K, S) float32, S = 2 (y, x) or 3 (z, y, x) in voxel units.
// out (N, C, H, W) for S = 2 or (N, C, D, H, W) for S = 3, float32,
// overwritten (=) in full.
// channels: null: landmark k draws into channel k (C == K); else (K) int32,
// the channel of each landmark (several may share one).
// All on the context's device. The CPU backend throws on a non-finite
// coordinate or a channel outside [0, C); the CUDA backend does not read
// device memory to check them: such a landmark draws nothing there.
void render_heatmaps(Context& ctx, const Tensor& landmarks, const HeatmapParams& p, Tensor& out,
                     const Tensor* channels = nullptr);
)

// The CPU renderer on host tensors, without a context: the loader's workers
// render a sample at a time with it.
// landmarks: (K, S) float32 CPU, S = out.dim() - 1 spatial dims (2 or 3), each
//   row (y, x) or (z, y, x) in voxel units; any finite value (outside is fine).
// channels: undefined: landmark k draws into channel k (C == K); or (K) int32
//   channel indices in [0, C), several landmarks may share one.
// out: (C, H, W) or (C, D, H, W) float32 CPU, overwritten (=) in full.
// Errors (shapes, dtypes, non-finite coordinates, channels out of range,
// radius or sigma out of range) are one-line fanout::Error.
// Separable loops: per landmark, a row of the window is an outer product of
// per-axis factor tables, a threshold and a max, vectorized.
void render_heatmaps(const Tensor& landmarks, const HeatmapParams& p, const Tensor& out,
                     const Tensor& channels = Tensor());

// The reference: a plain loop over every voxel of the volume per landmark,
// computing the offsets, the window test and the threshold voxel by voxel.
// Same arguments and the same bits as render_heatmaps; for tests and benchmarks.
void render_heatmaps_naive(const Tensor& landmarks, const HeatmapParams& p, const Tensor& out,
                           const Tensor& channels = Tensor());

// All K landmarks merged into one map: landmarks (K, S), out (H, W) or (D, H, W).
void render_heatmap_merged(const Tensor& landmarks, const HeatmapParams& p, const Tensor& out);

// A batch: landmarks (N, K, S), out (N, C, H, W) or (N, C, D, H, W); sample n
// is render_heatmaps(landmarks[n], p, out[n], channels). The CPU backend of
// the op above.
void render_heatmaps_batch(const Tensor& landmarks, const HeatmapParams& p, const Tensor& out,
                           const Tensor& channels = Tensor());

}  // namespace fanout::kernels
