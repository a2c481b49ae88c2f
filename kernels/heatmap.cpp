// Public heatmap entry point: parameter, shape, dtype and device checks, then
// dispatch; and the factor table every renderer draws with (host code: one
// rounding for all backends).
#include "kernels/heatmap.h"

#include <cmath>

#include "kernels/dispatch.h"

namespace fanout::kernels {

double heatmap_sigma(const HeatmapParams& p) { return p.sigma > 0 ? p.sigma : (2.0 * p.radius + 1.0) / 6.0; }

std::vector<float> heatmap_axis_factors(const HeatmapParams& p) {
  const double sigma = heatmap_sigma(p);
  const double two_sigma_sq = 2.0 * sigma * sigma;
  std::vector<float> f(static_cast<size_t>(p.radius) + 1);
  for (int64_t d = 0; d <= p.radius; ++d)
    f[static_cast<size_t>(d)] = static_cast<float>(std::exp(-static_cast<double>(d * d) / two_sigma_sq));
  return f;
}

void render_heatmaps(Context& ctx, const Tensor& landmarks, const HeatmapParams& p, Tensor& out,
                     const Tensor* channels) {
  const char* op = "render_heatmaps";
  FANOUT_CHECK(p.radius >= 0 && p.radius <= kMaxHeatmapRadius)
      << op << ": radius " << p.radius << " is outside 0.." << kMaxHeatmapRadius;
  FANOUT_CHECK(std::isfinite(p.sigma) && p.sigma >= 0)
      << op << ": sigma " << p.sigma << " must be finite and >= 0 (0: (2 * radius + 1) / 6)";
  detail::check_tensor(ctx, op, "landmarks", landmarks);
  detail::check_tensor(ctx, op, "out", out);
  const int spatial = out.dim() - 2;
  FANOUT_CHECK(spatial == 2 || spatial == 3)
      << op << ": out " << out.shape().str() << " must be (N, C, H, W) or (N, C, D, H, W)";
  FANOUT_CHECK(landmarks.dim() == 3 && landmarks.size(0) == out.size(0) && landmarks.size(2) == spatial)
      << op << ": landmarks " << landmarks.shape().str() << " must be (N, K, " << spatial << ") for out "
      << out.shape().str();
  const int64_t k = landmarks.size(1);
  if (channels) {
    detail::check_tensor(ctx, op, "channels", *channels, DType::I32);
    FANOUT_CHECK(channels->dim() == 1 && channels->size(0) == k)
        << op << ": channels " << channels->shape().str() << " must be (" << k << ") for landmarks "
        << landmarks.shape().str();
  } else {
    FANOUT_CHECK(out.size(1) == k) << op << ": out " << out.shape().str() << " has " << out.size(1)
                                   << " channels for " << k << " landmarks (pass channel indices to share channels)";
  }
  FANOUT_DISPATCH(ctx, render_heatmaps, ctx, landmarks, p, out, channels);
}

}  // namespace fanout::kernels
