// CPU softmax: per row the max over the visible entries (float), exp(x - max)
// in float (kept in y), their sum in double, y = e / sum rounded once; backward's
// sum(dy * y) in double. Rows are independent, so threads split them
// without changing a bit.
#include "kernels/softmax.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

void softmax_forward(Context& ctx, const Tensor& x, bool causal, Tensor& y) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const float* xp = x.f32();  // (rows, n)
  float* yp = y.f32();        // (rows, n)
  parallel_for(ctx, rows, grain_for(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * n;
      float* yr = yp + r * n;
      const int64_t visible = causal ? r % n + 1 : n;  // keys 0..i of query i
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) m = xr[j] > m ? xr[j] : m;
      if (m == -std::numeric_limits<float>::infinity()) {  // every visible entry -inf
        for (int64_t j = 0; j < n; ++j) yr[j] = 0.0f;
        continue;
      }
      double sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {  // e = exp(x - m) kept in y (x[j] is read first)
        yr[j] = std::exp(xr[j] - m);
        sum += yr[j];
      }
      for (int64_t j = 0; j < visible; ++j) yr[j] = static_cast<float>(yr[j] / sum);
      for (int64_t j = visible; j < n; ++j) yr[j] = 0.0f;
    }
  });
}

void softmax_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t n = y.size(-1), rows = y.numel() / n;
  const float *yp = y.f32(), *gp = dy.f32();  // (rows, n)
  float* dxp = dx.f32();                      // (rows, n), may be dy
  parallel_for(ctx, rows, grain_for(n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *yr = yp + r * n, *gr = gp + r * n;
      float* dr = dxp + r * n;
      double dot = 0.0;
      for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(gr[j]) * yr[j];
      for (int64_t j = 0; j < n; ++j) dr[j] = static_cast<float>(yr[j] * (gr[j] - dot));
    }
  });
}

}  // namespace fanout::kernels::cpu
