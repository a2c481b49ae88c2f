// CPU conversions: runtime/core/half.h element by element, and the x86 F16C instructions for float16 where the CPU has
// them (the same rounding: nearest even, subnormals kept, overflow to
// infinity, NaN quieted).
#include "kernels/convert.h"
#include "runtime/core/half.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/storage.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FANOUT_F16C 1
#endif

namespace fanout::kernels::cpu {

namespace {

#ifdef FANOUT_F16C
bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}

// Eight at a time; the tail through half.h.
__attribute__((target("avx,f16c"))) void to_f16_f16c(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) d[i] = half::f16_from_float(s[i]);
}
__attribute__((target("avx,f16c"))) void from_f16_f16c(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = half::float_from_f16(s[i]);
}
__attribute__((target("avx,f16c"))) void round_f16_f16c(float* a, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(a + i),
                                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  for (; i < n; ++i) a[i] = half::float_from_f16(half::f16_from_float(a[i]));
}
#endif

FANOUT_AVX2_CLONE void bf16_to_float(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = half::float_from_bf16(s[i]);
}
FANOUT_AVX2_CLONE void float_to_bf16(const float* s, uint16_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = half::bf16_from_float(s[i]);
}

}  // namespace

void widen_span(DType t, const void* src, float* dst, int64_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  if (t == DType::F32) return static_cast<void>(std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)));
  if (t == DType::BF16) return bf16_to_float(s, dst, n);
#ifdef FANOUT_F16C
  if (have_f16c()) return from_f16_f16c(s, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = half::float_from_f16(s[i]);
}

void narrow_span(DType t, const float* src, void* dst, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  if (t == DType::F32) return static_cast<void>(std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float)));
  if (t == DType::BF16) return float_to_bf16(src, d, n);
#ifdef FANOUT_F16C
  if (have_f16c()) return to_f16_f16c(src, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = half::f16_from_float(src[i]);
}

namespace {

// (n, c, s) of a logical (N, C, spatial...) shape: batch, channels, spatial elements.
struct Ncs {
  int64_t n, c, s;
};
Ncs ncs_of(const Shape& x) {
  const int64_t n = x[0], c = x[1];
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

}  // namespace

namespace {
constexpr int64_t kTile = 32;

// Each of n (rows, cols) planes of x written as the (cols, rows) plane of y,
// converted on the way, through 32 x 32 float tiles: both sides walk runs of
// consecutive addresses.
void transpose_planes(const Context& ctx, const Tensor& src, Tensor& dst, int64_t n, int64_t rows, int64_t cols) {
  const DType sd = src.dtype(), dd = dst.dtype();
  const size_t in_size = dtype_size(sd), out_size = dtype_size(dd);
  const char* x = static_cast<const char*>(src.raw());
  char* y = static_cast<char*>(dst.raw());
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  parallel_for(ctx, n * row_tiles, grain_for(kTile * cols), [&](int64_t b, int64_t e) {
    float in[kTile * kTile], out[kTile * kTile];  // in (rn, cn), out (cn, rn)
    for (int64_t job = b; job < e; ++job) {
      const int64_t plane = job / row_tiles, r0 = job % row_tiles * kTile, rn = std::min(kTile, rows - r0);
      const int64_t base = plane * rows * cols;
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t cn = std::min(kTile, cols - c0);
        // A tile as wide (tall) as its plane is one run of memory: one conversion.
        if (cn == cols) {
          widen_span(sd, x + (base + r0 * cols) * in_size, in, rn * cn);
        } else {
          for (int64_t i = 0; i < rn; ++i) widen_span(sd, x + (base + (r0 + i) * cols + c0) * in_size, in + i * cn, cn);
        }
        for (int64_t j = 0; j < cn; ++j)
          for (int64_t i = 0; i < rn; ++i) out[j * rn + i] = in[i * cn + j];
        if (rn == rows) {
          narrow_span(dd, out, y + (base + c0 * rows) * out_size, cn * rn);
        } else {
          for (int64_t j = 0; j < cn; ++j)
            narrow_span(dd, out + j * rn, y + (base + (c0 + j) * rows + r0) * out_size, rn);
        }
      }
    }
  });
}
}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  const DType sd = src.dtype(), dd = dst.dtype();
  if (src.format() == dst.format()) {  // the same order in memory: through float32 runs
    if (sd == dd) return static_cast<void>(std::memcpy(dst.raw(), src.raw(), src.nbytes()));
    const char* x = static_cast<const char*>(src.raw());
    char* y = static_cast<char*>(dst.raw());
    // One side float32: each thread's span converted straight, no float32 buffer between.
    if (sd == DType::F32 || dd == DType::F32)
      return parallel_for(ctx, src.numel(), grain_for(1), [&](int64_t s, int64_t e) {
        if (sd == DType::F32) narrow_span(dd, src.f32() + s, y + s * dtype_size(dd), e - s);
        else widen_span(sd, x + s * dtype_size(sd), dst.f32() + s, e - s);
      });
    float_runs(ctx, src.numel(), [&](int64_t i, int64_t k) {
      float buf[kRun];
      widen_span(sd, x + i * dtype_size(sd), buf, k);
      narrow_span(dd, buf, y + i * dtype_size(dd), k);
    });
    return;
  }
  const auto [n, c, s] = ncs_of(src.shape());
  if (dst.channels_last()) transpose_planes(ctx, src, dst, n, c, s);  // (c, s) planes -> (s, c)
  else transpose_planes(ctx, src, dst, n, s, c);
}

void round_to(Context&, Tensor& x, DType t) {
  float* a = x.f32();
  const int64_t n = x.numel();
  if (t == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) a[i] = half::float_from_bf16(half::bf16_from_float(a[i]));
    return;
  }
#ifdef FANOUT_F16C
  if (have_f16c()) return round_f16_f16c(a, n);
#endif
  for (int64_t i = 0; i < n; ++i) a[i] = half::float_from_f16(half::f16_from_float(a[i]));
}

void narrow_channels_last(Context&, const Tensor& src, Tensor& dst) {
  const auto [n, c, s] = ncs_of(src.shape());
  const float* x = src.f32();
  uint16_t* d = dst.data<uint16_t>();
  const bool bf16 = dst.dtype() == DType::BF16;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ci = 0; ci < c; ++ci) {
      const float* row = x + (b * c + ci) * s;
      uint16_t* col = d + b * s * c + ci;
      for (int64_t si = 0; si < s; ++si)
        col[si * c] = bf16 ? half::bf16_from_float(row[si]) : half::f16_from_float(row[si]);
    }
}

void widen_channels_first(Context&, const Tensor& src, Tensor& dst, bool accumulate) {
  const auto [n, c, s] = ncs_of(dst.shape());
  const uint16_t* x = src.data<uint16_t>();
  float* d = dst.f32();
  const bool bf16 = src.dtype() == DType::BF16;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ci = 0; ci < c; ++ci) {
      const uint16_t* col = x + b * s * c + ci;
      float* row = d + (b * c + ci) * s;
      for (int64_t si = 0; si < s; ++si) {
        const float v = bf16 ? half::float_from_bf16(col[si * c]) : half::float_from_f16(col[si * c]);
        row[si] = accumulate ? row[si] + v : v;
      }
    }
}

}  // namespace fanout::kernels::cpu
