// Elementwise loop helpers for the CPU kernels. An output may be the very
// same buffer as an input (in-place ops); g++ cannot prove that at compile
// time, its runtime overlap check fails for equal pointers and it falls back
// to a scalar, often branchy, loop. These helpers test for equality once and
// run a loop in which the aliasing is explicit, so every case vectorizes.
#pragma once
#include <cstdint>

// A loop marked FANOUT_AVX2_CLONE is also built for AVX2 and picked at run
// time (the build's baseline is SSE2). Only for loops whose sums are
// explicit and not contracted into FMAs (the build passes
// -ffp-contract=off): both builds then give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(FANOUT_NO_TARGET_CLONES)
#define FANOUT_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define FANOUT_AVX2_CLONE
#endif

namespace fanout::kernels::cpu {

// out[i] = f(a[i]); out may equal a.
template <class F>
inline void map1(const float* a, float* out, int64_t n, F f) {
  if (a == out) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(out[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
  }
}

// out[i] = f(a[i], b[i]); out may equal a or b (or both).
template <class F>
inline void map2(const float* a, const float* b, float* out, int64_t n, F f) {
  if (a == out && b == out) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(out[i], out[i]);
  } else if (a == out) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(out[i], b[i]);
  } else if (b == out) {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], out[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
  }
}

// Reductions with 8 independent partial sums, so the loop vectorizes without
// reassociation flags. The summation order depends on n only.
inline float sum_f32(const float* p, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += p[i];
  return s;
}

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace fanout::kernels::cpu
