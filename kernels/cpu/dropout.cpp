// CPU dropout: the mask drawn element by element from kernels/dropout.h's hash.
#include "kernels/dropout.h"

#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

void dropout(Context&, const Tensor& x, float p, uint64_t key, int64_t first_row, Tensor& y) {
  const int64_t n = x.size(0), sample = x.numel() / n;
  // Channels-last rows hold (spatial, channel) in memory; the draw takes the
  // logical index, so both formats drop the same elements.
  const bool last = x.channels_last();
  const int64_t c = last ? x.size(1) : 1, s = last ? sample / c : 1;
  const float scale = dropout_math::scale(p);
  with_storage(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t m = 0; m < sample; ++m) {
        const int64_t i = r * sample + m, e = last ? (m % c) * s + m / c : m;
        yp[i] = dropout_math::keep(key, first_row + r, e, p) ? narrow<T>(widen(xp[i]) * scale) : narrow<T>(0.0f);
      }
  });
}

}  // namespace fanout::kernels::cpu
