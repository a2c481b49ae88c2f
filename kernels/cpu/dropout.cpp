// CPU dropout: the mask drawn element by element from kernels/dropout.h's hash.
#include "kernels/dropout.h"

#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, Tensor& y) {
  const int64_t sample = x.numel() / x.size(0);
  // Channels-last rows hold (spatial, channel) in memory; the draw takes the
  // logical index, so both formats drop the same elements.
  const bool last = x.channels_last();
  const int64_t c = last ? x.size(1) : 1, s = last ? sample / c : 1;
  const float scale = dropout_math::scale(p);
  const DType t = x.dtype();
  const size_t size = dtype_size(t);
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
  float_runs(ctx, x.numel(), [&](int64_t first, int64_t k) {
    float buf[kRun];
    widen_span(t, xp + first * size, buf, k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = first + j, r = i / sample, m = i % sample, e = last ? (m % c) * s + m / c : m;
      buf[j] = dropout_math::keep(key, first_row + r, e, p) ? buf[j] * scale : 0.0f;
    }
    narrow_span(t, buf, yp + first * size, k);
  });
}

}  // namespace fanout::kernels::cpu
