// CPU conversions: runtime/core/half.h element by element (kernels/cpu/
// storage.h), and the x86 F16C instructions for float16 where the CPU has
// them (the same rounding: nearest even, subnormals kept, overflow to
// infinity, NaN quieted).
#include "kernels/convert.h"
#include "runtime/core/half.h"

#include <cstring>

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

// Float32 to or from a low type, element by element in memory order.
void convert_flat(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  if (src.dtype() == DType::F32) {
    const float* s = src.f32();
    uint16_t* d = dst.data<uint16_t>();
    if (dst.dtype() == DType::BF16) {
      for (int64_t i = 0; i < n; ++i) d[i] = half::bf16_from_float(s[i]);
      return;
    }
#ifdef FANOUT_F16C
    if (have_f16c()) return to_f16_f16c(s, d, n);
#endif
    for (int64_t i = 0; i < n; ++i) d[i] = half::f16_from_float(s[i]);
    return;
  }
  const uint16_t* s = src.data<uint16_t>();
  float* d = dst.f32();
  if (src.dtype() == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) d[i] = half::float_from_bf16(s[i]);
    return;
  }
#ifdef FANOUT_F16C
  if (have_f16c()) return from_f16_f16c(s, d, n);
#endif
  for (int64_t i = 0; i < n; ++i) d[i] = half::float_from_f16(s[i]);
}

// (n, c, s) of a logical (N, C, spatial...) shape: batch, channels, spatial elements.
struct Ncs {
  int64_t n, c, s;
};
Ncs ncs_of(const Shape& x) {
  const int64_t n = x[0], c = x[1];
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  const DType sd = src.dtype(), dd = dst.dtype();
  if (src.format() == dst.format()) {  // the same order in memory
    if (sd == dd) return static_cast<void>(std::memcpy(dst.raw(), src.raw(), src.nbytes()));
    if (sd == DType::F32 || dd == DType::F32) return convert_flat(src, dst);
  }
  // Between low types in one order, or between orders: element by element.
  const auto [n, c, s] = ncs_of(src.shape());
  const bool same = src.format() == dst.format(), to_last = dst.channels_last();
  with_storage(sd, [&](auto in_tag) {
    with_storage(dd, [&](auto out_tag) {
      using In = decltype(in_tag);
      using Out = decltype(out_tag);
      const In* x = src.data<In>();
      Out* y = dst.data<Out>();
      if (same) {
        parallel_for(ctx, src.numel(), grain_for(1), [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) y[i] = narrow<Out>(widen(x[i]));
        });
        return;
      }
      parallel_for(ctx, n * s, grain_for(c), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {  // r = batch * s + position
          const int64_t bi = r / s, si = r % s;
          for (int64_t ci = 0; ci < c; ++ci) {
            const int64_t first = (bi * c + ci) * s + si, last = r * c + ci;
            if (to_last) y[last] = narrow<Out>(widen(x[first]));
            else y[first] = narrow<Out>(widen(x[last]));
          }
        }
      });
    });
  });
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
