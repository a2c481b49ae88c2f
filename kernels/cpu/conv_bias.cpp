// CPU per-channel bias and its gradient.
#include "kernels/conv_bias.h"

namespace fanout::kernels::cpu {

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

void channel_bias_grad(Context&, const Tensor& dy, Tensor& db) {
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
