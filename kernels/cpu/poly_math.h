// Branch-free float exp and erf for the CPU kernels' row loops (GELU, the
// softmax cross-entropy): plain arithmetic and selects, so a loop over them
// vectorizes (with FANOUT_AVX2_CLONE, kernels/cpu/loops.h) where libm's
// expf and erff are a call per element.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace fanout::kernels::cpu {

// exp(x): x = n ln2 + r, exp(r) by Cephes' expf polynomial (about 1 ulp),
// 2^n put into the exponent bits. 0 below -87.3 (where float's normal range
// ends; -inf gives 0), exp(88) at most (callers pass x <= 0 or moderate x),
// NaN for NaN.
__attribute__((always_inline)) inline float exp_poly(float x) {
  const bool under = x < -87.3f;
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return under ? 0.0f : e;
}

// erf(x) = sign(x) (1 - t (a1 + t (a2 + ...)) exp(-x^2)), t = 1 / (1 + p |x|):
// Abramowitz and Stegun 7.1.26, |error| < 1.5e-7 (as ATen's vectorized GELU),
// given e = exp_poly(-x * x) (GELU's backward shares it with the density).
__attribute__((always_inline)) inline float erf_poly_given(float x, float e) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  float q = 1.061405429f;
  q = q * t - 1.453152027f;
  q = q * t + 1.421413741f;
  q = q * t - 0.284496736f;
  q = q * t + 0.254829592f;
  return std::copysign(1.0f - q * t * e, x);
}
__attribute__((always_inline)) inline float erf_poly(float x) { return erf_poly_given(x, exp_poly(-x * x)); }

}  // namespace fanout::kernels::cpu
