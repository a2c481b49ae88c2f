// CPU layer normalization: per row two passes in double for the
// statistics (rows split over the threads); backward's row sums in double, per-element sums for gamma and
// beta over rows in a fixed order (per sample first under split-invariant math).
#include <algorithm>

#include "kernels/layernorm.h"

#include "kernels/cpu/loops.h"
#include "kernels/cpu/norm_rows.h"
#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

namespace {
FANOUT_AVX2_CLONE void forward_rows(const float* xp, const float* g, const float* b, float eps, int64_t d,
                                    int64_t r0, int64_t r1, float* yp, float* mean, float* rstd) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = xp + r * d;
    const RowMoments st = row_moments(xr, d, eps);
    mean[r] = static_cast<float>(st.mu);
    rstd[r] = static_cast<float>(st.r);
    const float muf = static_cast<float>(st.mu), rf = static_cast<float>(st.r);
    float* yr = yp + r * d;
    for (int64_t k = 0; k < d; ++k) yr[k] = ((xr[k] - muf) * rf) * g[k] + b[k];
  }
}

// One sample's rows [r0, r1) into the per-element sums pg (dy xhat) and pb (dy), in row order.
FANOUT_AVX2_CLONE void param_sums(const float* xp, const float* dyp, const float* mean, const float* rstd, int64_t d,
                                  int64_t r0, int64_t r1, double* pg, double* pb) {
  for (int64_t r = r0; r < r1; ++r) {
    const double mu = mean[r], rs = rstd[r];
    const float *xr = xp + r * d, *dr = dyp + r * d;
    for (int64_t k = 0; k < d; ++k) {
      pg[k] += dr[k] * ((xr[k] - mu) * rs);
      pb[k] += dr[k];
    }
  }
}

FANOUT_AVX2_CLONE void dx_rows(const float* xp, const float* dyp, const float* g, const float* mean, const float* rstd,
                               int64_t d, int64_t r0, int64_t r1, float* dxp) {
  for (int64_t r = r0; r < r1; ++r)
    row_dx(xp + r * d, dyp + r * d, d, 1, g, RowMoments{mean[r], rstd[r]}, dxp + r * d);
}
}  // namespace

void layer_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  const float *xp = x.f32(), *g = gamma.f32(), *b = beta.f32();
  float *yp = y.f32(), *mp = mean.f32(), *rp = rstd.f32();
  parallel_for(ctx, rows, grain_for(4 * d),
               [&](int64_t r0, int64_t r1) { forward_rows(xp, g, b, eps, d, r0, r1, yp, mp, rp); });
}

void layer_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t d = gamma.numel(), rows = x.numel() / d, per_sample = rows / x.size(0);
  const float *xp = x.f32(), *dyp = dy.f32(), *g = gamma.f32();
  float* dxp = dx.f32();
  const bool exact = dgamma.dtype() == DType::F64;
  // Per element k: each sample's rows summed in order (pg, pb), then the
  // samples (sg, sb); rows are walked in memory order, each k in its own slot.
  double* acc = static_cast<double*>(ctx.workspace(sizeof(double) * 4 * static_cast<size_t>(d)));
  double *pg = acc, *pb = acc + d, *sg = acc + 2 * d, *sb = acc + 3 * d;
  std::fill(sg, sg + 2 * d, 0.0);
  for (int64_t i = 0; i < x.size(0); ++i) {
    std::fill(pg, pg + 2 * d, 0.0);
    param_sums(xp, dyp, mean.f32(), rstd.f32(), d, i * per_sample, (i + 1) * per_sample, pg, pb);
    for (int64_t k = 0; k < d; ++k) {
      if (exact) {  // a float per sample, summed exactly whatever the split
        dgamma.f64()[k] += static_cast<float>(pg[k]);
        dbeta.f64()[k] += static_cast<float>(pb[k]);
      }
      sg[k] += pg[k];
      sb[k] += pb[k];
    }
  }
  if (!exact)
    for (int64_t k = 0; k < d; ++k) {
      dgamma.f32()[k] += static_cast<float>(sg[k]);
      dbeta.f32()[k] += static_cast<float>(sb[k]);
    }
  const float *mp = mean.f32(), *rp = rstd.f32();
  parallel_for(ctx, rows, grain_for(4 * d), [&](int64_t r0, int64_t r1) { dx_rows(xp, dyp, g, mp, rp, d, r0, r1, dxp); });
}

}  // namespace fanout::kernels::cpu
