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

// Row sums in kLanes double accumulators (value k in lane k % kLanes), the
// lanes added in a fixed tree: one chain of adds is latency-bound, lanes
// vectorize; a row's sums depend on the row alone (not on threads or rows).
constexpr int64_t kLanes = 8;
inline double lanes_total(const double* s) { return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])); }

// x[0, m)'s moments, two passes in double.
inline RowMoments row_moments(const float* x, int64_t m, float eps) {
  double s[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= m; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) s[j] += x[k + j];
  for (; k < m; ++k) s[k % kLanes] += x[k];
  const double mu = lanes_total(s) / static_cast<double>(m);
  double q[kLanes] = {};
  for (k = 0; k + kLanes <= m; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) q[j] += (x[k + j] - mu) * (x[k + j] - mu);
  for (; k < m; ++k) q[k % kLanes] += (x[k] - mu) * (x[k] - mu);
  return {mu, 1.0 / std::sqrt(lanes_total(q) / static_cast<double>(m) + eps)};
}

// The row's input gradient, written (=; dx may alias dy), in double:
// dx = r * (dy g - mean(dy g) - xhat * mean(dy g xhat)), where runs of `run`
// consecutive values share one gamma (gamma[k / run]).
inline void row_dx(const float* x, const float* dy, int64_t m, int64_t run, const float* gamma, RowMoments st,
                   float* dx) {
  double sd = 0, sdx = 0;  // sums of dxhat and dxhat * xhat over the row
  if (run == 1) {          // one gamma per value (LayerNorm): in lanes
    double a[kLanes] = {}, b[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= m; k += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) {
        const double dxh = dy[k + j] * static_cast<double>(gamma[k + j]);
        a[j] += dxh;
        b[j] += dxh * ((x[k + j] - st.mu) * st.r);
      }
    for (; k < m; ++k) {
      const double dxh = dy[k] * static_cast<double>(gamma[k]);
      a[k % kLanes] += dxh;
      b[k % kLanes] += dxh * ((x[k] - st.mu) * st.r);
    }
    sd = lanes_total(a);
    sdx = lanes_total(b);
  } else {
    for (int64_t j = 0, k = 0; j < m / run; ++j) {
      const double g = gamma[j];
      for (int64_t e = 0; e < run; ++e, ++k) {
        const double dxh = dy[k] * g;
        sd += dxh;
        sdx += dxh * ((x[k] - st.mu) * st.r);
      }
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
