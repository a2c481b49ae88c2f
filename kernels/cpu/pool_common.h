// Max-pooling steps shared by the 2-D and 3-D CPU pooling kernels.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/pool.h"

namespace fanout::kernels::cpu {

// Window [lo, hi) of output index o along one axis of length len, clipped to
// the axis: padding is never selected by max pooling (it acts as -inf).
inline void window(int64_t o, const PoolGeometry& g, int64_t len, int64_t& lo, int64_t& hi) {
  const int64_t start = o * g.stride - g.padding;
  lo = std::max<int64_t>(start, 0);
  hi = std::min<int64_t>(start + g.kernel, len);
}

// Outputs [lo, hi) (of `out` along the axis) whose windows hold input index
// i: o * stride - padding <= i < o * stride - padding + kernel.
inline void covering(int64_t i, const PoolGeometry& g, int64_t out, int64_t& lo, int64_t& hi) {
  const int64_t p = i + g.padding;
  lo = p >= g.kernel ? (p - g.kernel) / g.stride + 1 : 0;
  hi = std::min<int64_t>(p / g.stride + 1, out);
}

// Max-pool select step: take v when it is larger, or NaN (NaN propagates, as
// PyTorch's CPU kernel); a strict > keeps the first of equal maxima. Written
// branch-free: on real data a branch here mispredicts about half the time.
inline void take_max(float v, int32_t idx, float& best, int32_t& best_i) {
  const bool take = (v > best) | (v != v);
  best = take ? v : best;
  best_i = take ? idx : best_i;
}

}  // namespace fanout::kernels::cpu
