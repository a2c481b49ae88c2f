// CPU dropout: the mask drawn element by element from kernels/dropout.h's hash.
#include "kernels/dropout.h"

#include <bit>
#include <cmath>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

namespace {
// buf[j] kept and scaled, or zeroed, by the draw from hash input in[j] (row key ^ element): dropout_math's
// keep_in_row, one loop the AVX2 clone runs four hashes at a time.
// The draw u = (h >> 40) / 2^24 passes u >= p exactly when h >> 40 >= ceil(p 2^24) (both sides exact).
FANOUT_AVX2_CLONE void mask_run(const uint64_t* in, float p, float scale, float* buf, int64_t n) {
  const auto at_least = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  for (int64_t j = 0; j < n; ++j) {
    const auto draw = static_cast<uint32_t>(splitmix64(in[j]) >> 40);
    const uint32_t kept = std::bit_cast<uint32_t>(buf[j] * scale) & (0u - static_cast<uint32_t>(draw >= at_least));
    buf[j] = std::bit_cast<float>(kept);  // +0 where dropped
  }
}
}  // namespace

void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, int64_t row_stride, Tensor& y) {
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
    uint64_t in[kRun];
    widen_span(t, xp + first * size, buf, k);
    // Row, position in the row and its (spatial, channel) counted along, the row's key hashed once.
    int64_t r = first / sample, m = first % sample, ch = last ? m % c : 0, sp = last ? m / c : 0;
    uint64_t rk = dropout_math::row_key(key, first_row + r * row_stride);
    for (int64_t j = 0; j < k; ++j) {
      in[j] = rk ^ static_cast<uint64_t>(last ? ch * s + sp : m);
      if (++m == sample) m = 0, ch = 0, sp = 0, rk = dropout_math::row_key(key, first_row + ++r * row_stride);
      else if (last && ++ch == c) ch = 0, ++sp;
    }
    mask_run(in, p, scale, buf, k);
    narrow_span(t, buf, yp + first * size, k);
  });
}

}  // namespace fanout::kernels::cpu
