// CPU per-channel bias and its gradient; the gradient of channels-last
// storage (any floating type) read as stored, rows of channels.
#include "kernels/conv_bias.h"

#include <algorithm>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

namespace {
// The same sums over a channels-last dy (N, spatial, C): each sample's sum
// per channel in double over its positions in order (samples in parallel,
// into the workspace), then added in sample order as below.
void rows_bias_grad(Context& ctx, const Tensor& dy, Tensor& db) {
  const int64_t n = dy.size(0), c = dy.size(1), s = dy.numel() / (n * c);
  const bool exact = db.dtype() == DType::F64;
  const size_t es = dtype_size(dy.dtype());
  const char* dp = static_cast<const char*>(dy.raw());
  double* parts = static_cast<double*>(ctx.workspace(sizeof(double) * static_cast<size_t>(n * c)));
  parallel_for(ctx, n, grain_for(s * c), [&](int64_t i0, int64_t i1) {
    float buf[kRun];
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t c0 = 0; c0 < c; c0 += kRun) {
        const int64_t k = std::min<int64_t>(kRun, c - c0);
        double* part = parts + i * c + c0;
        std::fill(part, part + k, 0.0);
        for (int64_t p = 0; p < s; ++p) {
          widen_short(dy.dtype(), dp + ((i * s + p) * c + c0) * es, buf, k);
          for (int64_t j = 0; j < k; ++j) part[j] += buf[j];
        }
      }
  });
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (exact) db.f64()[ch] += static_cast<float>(parts[i * c + ch]);
      sum += parts[i * c + ch];
    }
    if (!exact) db.f32()[ch] += static_cast<float>(sum);
  }
}
}  // namespace

void channel_bias_add(Context&, Tensor& y, const Tensor& b) {
  const int64_t n = y.size(0), c = y.size(1), s = y.numel() / (n * c);
  float* yp = y.f32();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      float* row = yp + (i * c + ch) * s;
      const float v = b.f32()[ch];
      for (int64_t k = 0; k < s; ++k) row[k] += v;
    }
}

void channel_bias_grad(Context& ctx, const Tensor& dy, Tensor& db) {
  if (dy.channels_last()) return rows_bias_grad(ctx, dy, db);
  const int64_t n = dy.size(0), c = dy.size(1), s = dy.numel() / (n * c);
  const bool exact = db.dtype() == DType::F64;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = dy.f32() + (i * c + ch) * s;
      double part = 0;  // this sample's
      for (int64_t k = 0; k < s; ++k) part += row[k];
      if (exact) db.f64()[ch] += static_cast<float>(part);
      sum += part;
    }
    if (!exact) db.f32()[ch] += static_cast<float>(sum);
  }
}

}  // namespace fanout::kernels::cpu
