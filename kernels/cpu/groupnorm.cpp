// CPU group normalization: per (sample, group) two passes in double for the
// statistics; backward's group sums in double, per-channel sums for gamma
// and beta over samples in a fixed order.
#include "kernels/groupnorm.h"

#include "kernels/cpu/norm_rows.h"

namespace fanout::kernels::cpu {

void group_norm_forward(Context&, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c), cg = c / groups, m = cg * s;
  const float *xp = x.f32(), *g = gamma.f32(), *b = beta.f32();
  float* yp = y.f32();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t gr = 0; gr < groups; ++gr) {
      const int64_t base = (i * c + gr * cg) * s;
      const RowMoments st = row_moments(xp + base, m, eps);
      mean.f32()[i * groups + gr] = static_cast<float>(st.mu);
      rstd.f32()[i * groups + gr] = static_cast<float>(st.r);
      for (int64_t ch = 0; ch < cg; ++ch) {
        const int64_t cc = gr * cg + ch;
        const float scale = static_cast<float>(st.r) * g[cc];
        const float shift = b[cc] - static_cast<float>(st.mu) * scale;
        const float* xr = xp + base + ch * s;
        float* yr = yp + base + ch * s;
        for (int64_t k = 0; k < s; ++k) yr[k] = xr[k] * scale + shift;
      }
    }
}

void group_norm_backward(Context&, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, int groups, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c), cg = c / groups, m = cg * s;
  const float *xp = x.f32(), *dyp = dy.f32(), *g = gamma.f32();
  float* dxp = dx.f32();
  const bool exact = dgamma.dtype() == DType::F64;
  for (int64_t cc = 0; cc < c; ++cc) {
    double sg = 0, sb = 0;  // this channel's sums over samples and positions
    const int64_t gr = cc / cg;
    for (int64_t i = 0; i < n; ++i) {
      const double mu = mean.f32()[i * groups + gr], r = rstd.f32()[i * groups + gr];
      const float* xr = xp + (i * c + cc) * s;
      const float* dr = dyp + (i * c + cc) * s;
      double pg = 0, pb = 0;  // this sample's
      for (int64_t k = 0; k < s; ++k) {
        pg += dr[k] * ((xr[k] - mu) * r);
        pb += dr[k];
      }
      if (exact) {  // a float per sample, summed exactly whatever the split
        dgamma.f64()[cc] += static_cast<float>(pg);
        dbeta.f64()[cc] += static_cast<float>(pb);
      }
      sg += pg;
      sb += pb;
    }
    if (!exact) {
      dgamma.f32()[cc] += static_cast<float>(sg);
      dbeta.f32()[cc] += static_cast<float>(sb);
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t gr = 0; gr < groups; ++gr) {
      const int64_t base = (i * c + gr * cg) * s;
      const RowMoments st{mean.f32()[i * groups + gr], rstd.f32()[i * groups + gr]};
      row_dx(xp + base, dyp + base, m, s, g + gr * cg, st, dxp + base);
    }
}

}  // namespace fanout::kernels::cpu
