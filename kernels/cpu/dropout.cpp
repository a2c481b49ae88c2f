// CPU dropout: the mask drawn element by element from kernels/dropout.h's hash.
#include "kernels/dropout.h"

namespace fanout::kernels::cpu {

void dropout(Context&, const Tensor& x, float p, uint64_t key, int64_t first_row, Tensor& y) {
  const int64_t n = x.size(0), sample = x.numel() / n;
  const float s = dropout_math::scale(p);
  const float* xp = x.f32();
  float* yp = y.f32();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < sample; ++e) {
      const int64_t i = r * sample + e;
      yp[i] = dropout_math::keep(key, first_row + r, e, p) ? xp[i] * s : 0.0f;
    }
}

}  // namespace fanout::kernels::cpu
