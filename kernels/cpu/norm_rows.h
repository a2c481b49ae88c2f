// Steps GroupNorm and LayerNorm share on the CPU: each normalizes rows of m
// contiguous values (a (sample, group), or one row of the normalized shape)
// with their biased variance; the CUDA kernels do the same arithmetic
// (kernels/cuda/common.cuh).
#pragma once
#include <cmath>
#include <cstdint>

namespace fanout::kernels::cpu {

struct RowMoments {
  double mu, r;  // the mean and 1 / sqrt(var + eps)
};

// x[0, m)'s moments, two passes in double.
inline RowMoments row_moments(const float* x, int64_t m, float eps) {
  double sum = 0;
  for (int64_t k = 0; k < m; ++k) sum += x[k];
  const double mu = sum / static_cast<double>(m);
  double sq = 0;
  for (int64_t k = 0; k < m; ++k) sq += (x[k] - mu) * (x[k] - mu);
  return {mu, 1.0 / std::sqrt(sq / static_cast<double>(m) + eps)};
}

// The row's input gradient, written (=; dx may alias dy), in double:
// dx = r * (dy g - mean(dy g) - xhat * mean(dy g xhat)), where runs of `run`
// consecutive values share one gamma (gamma[k / run]).
inline void row_dx(const float* x, const float* dy, int64_t m, int64_t run, const float* gamma, RowMoments st,
                   float* dx) {
  double sd = 0, sdx = 0;  // sums of dxhat and dxhat * xhat over the row
  for (int64_t j = 0, k = 0; j < m / run; ++j) {
    const double g = gamma[j];
    for (int64_t e = 0; e < run; ++e, ++k) {
      const double dxh = dy[k] * g;
      sd += dxh;
      sdx += dxh * ((x[k] - st.mu) * st.r);
    }
  }
  const double inv_m = 1.0 / static_cast<double>(m);
  for (int64_t j = 0, k = 0; j < m / run; ++j) {
    const double g = gamma[j];
    for (int64_t e = 0; e < run; ++e, ++k) {
      const double xh = (x[k] - st.mu) * st.r;
      dx[k] = static_cast<float>(st.r * (dy[k] * g - inv_m * sd - xh * inv_m * sdx));
    }
  }
}

}  // namespace fanout::kernels::cpu
