// CPU layer normalization: per row two passes in double for the
// statistics; backward's row sums in double, per-element sums for gamma and
// beta over rows in a fixed order (per sample first under split-invariant math).
#include <algorithm>

#include "kernels/layernorm.h"

#include "kernels/cpu/norm_rows.h"

namespace fanout::kernels::cpu {

void layer_norm_forward(Context&, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  const float *xp = x.f32(), *g = gamma.f32(), *b = beta.f32();
  float* yp = y.f32();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    const RowMoments st = row_moments(xr, d, eps);
    mean.f32()[r] = static_cast<float>(st.mu);
    rstd.f32()[r] = static_cast<float>(st.r);
    const float muf = static_cast<float>(st.mu), rf = static_cast<float>(st.r);
    float* yr = yp + r * d;
    for (int64_t k = 0; k < d; ++k) yr[k] = ((xr[k] - muf) * rf) * g[k] + b[k];
  }
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
    for (int64_t r = i * per_sample; r < (i + 1) * per_sample; ++r) {
      const double mu = mean.f32()[r], rs = rstd.f32()[r];
      const float *xr = xp + r * d, *dr = dyp + r * d;
      for (int64_t k = 0; k < d; ++k) {
        pg[k] += dr[k] * ((xr[k] - mu) * rs);
        pb[k] += dr[k];
      }
    }
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
  for (int64_t r = 0; r < rows; ++r)
    row_dx(xp + r * d, dyp + r * d, d, 1, g, RowMoments{mean.f32()[r], rstd.f32()[r]}, dxp + r * d);
}

}  // namespace fanout::kernels::cpu
