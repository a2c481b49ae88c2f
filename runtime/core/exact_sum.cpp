// Exact float accumulation.
#include "runtime/core/exact_sum.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace fanout {

void ExactSum::add(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t exp = (bits >> 23) & 0xff;
  const uint32_t frac = bits & 0x7fffff;
  const bool neg = bits >> 31;
  if (exp == 0xff) {
    ++s_[frac ? kLimbs : (neg ? kLimbs + 2 : kLimbs + 1)];
    return;
  }
  // v = m * 2^(p - 149): subnormals have exponent field 0 and no hidden bit.
  const uint64_t m = exp == 0 ? frac : (frac | 0x800000u);
  if (m == 0) return;
  const int p = exp == 0 ? 0 : static_cast<int>(exp) - 1;
  const uint64_t shifted = m << (p % 32);  // < 2^55
  const int limb = p / 32;
  const int64_t lo = static_cast<int64_t>(shifted & 0xffffffffu), hi = static_cast<int64_t>(shifted >> 32);
  if (neg) {
    s_[limb] -= lo;
    s_[limb + 1] -= hi;
  } else {
    s_[limb] += lo;
    s_[limb + 1] += hi;
  }
  // Each limb moves by less than 2^32 per addition: normalize long before int64 could overflow.
  if (++adds_ >= (int64_t{1} << 30)) normalize();
}

void ExactSum::merge(const ExactSum& o) {
  for (int i = 0; i < kSlots; ++i) s_[i] += o.s_[i];
  normalize();
}

void ExactSum::normalize() {
  // Carry so that limbs 0..kLimbs-2 lie in [0, 2^32); the top limb keeps the sign.
  for (int i = 0; i + 1 < kLimbs; ++i) {
    const int64_t carry = s_[i] >> 32;  // floor division by 2^32
    s_[i] -= carry * (int64_t{1} << 32);
    s_[i + 1] += carry;
  }
  adds_ = 0;
}

double ExactSum::value() const {
  const int64_t nans = s_[kLimbs], pinf = s_[kLimbs + 1], ninf = s_[kLimbs + 2];
  if (nans > 0 || (pinf > 0 && ninf > 0)) return std::numeric_limits<double>::quiet_NaN();
  if (pinf > 0) return std::numeric_limits<double>::infinity();
  if (ninf > 0) return -std::numeric_limits<double>::infinity();
  return finite_value();
}

double ExactSum::finite_value() const {
  ExactSum n = *this;
  n.normalize();
  // Top limb first: a fixed order, so equal limbs always give equal bits.
  double v = 0;
  for (int i = kLimbs - 1; i >= 0; --i) v += std::ldexp(static_cast<double>(n.s_[i]), 32 * i - 149);
  return v;
}

}  // namespace fanout
