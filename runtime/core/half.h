// float32 <-> bfloat16 and IEEE float16 on the host, bit by bit: round to
// nearest, ties to even (what torch's .to(torch.bfloat16 / torch.float16)
// and CUDA's __float2bfloat16_rn / __float2half_rn do), overflow to
// infinity, subnormals kept, NaN stays a (quiet) NaN, the sign of zero kept.
// Widening is exact. The CPU conversion kernels (kernels/convert.h) use these.
#pragma once
#include <cstdint>
#include <cstring>

namespace fanout::half {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 is float32's upper half: round the lower 16 bits away.
// Branch-free (a select), so loops over it vectorize.
inline uint16_t bf16_from_float(float f) {
  const uint32_t u = bits_of(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // ties to even; a carry moves into the exponent
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float float_from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline uint16_t f16_from_float(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): infinity
  if (a >= 0x38800000u) {  // normal in float16 (>= 2^-14): rebias 127 -> 15, round 13 bits away
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal (or zero) in float16: value / 2^-24, rounded to an integer.
  const uint32_t e = a >> 23;  // biased float32 exponent, < 113
  if (e < 102) return sign;    // below 2^-25: rounds to zero
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // 24 significant bits
  const uint32_t shift = 126 - e;                  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 0x400 is the smallest normal: still right
  return static_cast<uint16_t>(sign | q);
}
inline float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return float_of(sign | 0x7f800000u | (m << 13));           // inf, NaN
  if (e != 0) return float_of(sign | ((e + 112u) << 23) | (m << 13));        // normal
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;             // subnormal: m * 2^-24, exact
  return sign ? -v : v;
}

}  // namespace fanout::half
