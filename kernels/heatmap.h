// Landmark heatmaps of a batch, on the context's device: the op behind
// runtime/data/heatmap.h's render_heatmaps_batch, which defines the values
// (a Gaussian of radius r per landmark, per-axis factors float(exp(-d^2 /
// (2 sigma^2))) computed in double and multiplied in float in axis order
// (z, y, x), values below FLT_EPSILON set to 0, clipped to the volume,
// max-merged into the landmark's channel). Every backend gives those bits.
#pragma once
#include <vector>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// Largest radius accepted, as data::kMaxHeatmapRadius.
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

}  // namespace fanout::kernels
