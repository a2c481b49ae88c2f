// ExactSum: the exact sum of float values in a fixed-point accumulator wide
// enough for every finite float (a Kulisch accumulator), so the same values
// give the same bits in any order, split or grouping: across batches,
// devices and processes alike. Its state is integers, summed across
// processes as integers. Used for loss sums in epoch statistics.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>

namespace fanout {

class ExactSum {
 public:
  // Fixed point with the least significant bit at 2^-149 (the smallest float),
  // in 32-bit digits held in int64 limbs; the last three slots count NaNs,
  // +infinities and -infinities.
  static constexpr int kLimbs = 10;
  static constexpr int kSlots = kLimbs + 3;

  void add(float v);
  void add(const float* v, int64_t n) {
    for (int64_t i = 0; i < n; ++i) add(v[i]);
  }
  // A count of any size, exactly (in floats of at most 2^24, which hold it exactly).
  void add_count(int64_t n) {
    constexpr int64_t kExact = int64_t{1} << 24;
    for (; n > 0; n -= std::min(n, kExact)) add(static_cast<float>(std::min(n, kExact)));
  }
  void merge(const ExactSum& o);
  // The sum rounded to double (NaN if any NaN or both infinities were added).
  double value() const;
  // The sum of the finite values alone, and how many were not finite.
  double finite_value() const;
  int64_t non_finite() const { return s_[kLimbs] + s_[kLimbs + 1] + s_[kLimbs + 2]; }
  std::array<int64_t, kSlots>& slots() { return s_; }
  const std::array<int64_t, kSlots>& slots() const { return s_; }

 private:
  void normalize();
  std::array<int64_t, kSlots> s_{};
  int64_t adds_ = 0;  // additions since the last normalization
};

}  // namespace fanout
