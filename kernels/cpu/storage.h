// Floating storage for the CPU kernels that read and write float32,
// bfloat16 or float16 tensors with float32 arithmetic: loads widen (exact),
// stores round to nearest even (runtime/core/half.h), as a GPU kernel on
// __nv_bfloat16 or __half storage does.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>

#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/core/tensor.h"

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline float widen(float v) { return v; }
inline float widen(Bf16 v) { return half::float_from_bf16(v.bits); }
inline float widen(F16 v) { return half::float_from_f16(v.bits); }

template <class T>
inline T narrow(float v);
template <>
inline float narrow<float>(float v) { return v; }
template <>
inline Bf16 narrow<Bf16>(float v) { return {half::bf16_from_float(v)}; }
template <>
inline F16 narrow<F16>(float v) { return {half::f16_from_float(v)}; }

// f(T{}) with T the element type of dtype t: float, Bf16 or F16.
template <class F>
decltype(auto) with_storage(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(Bf16{});
    case DType::F16: return f(F16{});
    default: FANOUT_FAIL() << "no floating storage of type " << dtype_name(t);
  }
}

// n values of type t (float32, bfloat16 or float16) to float32 and back
// (rounded to nearest even); float16 through F16C where the CPU has it.
// kernels/cpu/convert.cpp.
void widen_span(DType t, const void* src, float* dst, int64_t n);
void narrow_span(DType t, const float* src, void* dst, int64_t n);

// out[i] = f(a[i]) over tensors of one storage type and layout, in float32,
// rounded as it is stored, in runs of 256 through float32; out may be a.
// Float32 takes `f32`, the loop the caller vectorizes (kernels/cpu/loops.h).
template <class F, class F32Loop>
void storage_map1(const Context& ctx, const Tensor& a, Tensor& out, F f, F32Loop f32) {
  if (a.dtype() == DType::F32) return f32(a.f32(), out.f32());
  const DType t = a.dtype();
  const char* ap = static_cast<const char*>(a.raw());
  char* op = static_cast<char*>(out.raw());
  parallel_for(ctx, out.numel(), grain_for(1), [&](int64_t s, int64_t e) {
    float buf[256];
    for (int64_t i = s; i < e; i += 256) {
      const int64_t k = std::min<int64_t>(256, e - i);
      widen_span(t, ap + i * 2, buf, k);
      for (int64_t j = 0; j < k; ++j) buf[j] = f(buf[j]);
      narrow_span(t, buf, op + i * 2, k);
    }
  });
}

// out[i] = f(a[i], b[i]) likewise; out may be a or b.
template <class F, class F32Loop>
void storage_map2(const Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, F f, F32Loop f32) {
  if (a.dtype() == DType::F32) return f32(a.f32(), b.f32(), out.f32());
  const DType t = a.dtype();
  const char *ap = static_cast<const char*>(a.raw()), *bp = static_cast<const char*>(b.raw());
  char* op = static_cast<char*>(out.raw());
  parallel_for(ctx, out.numel(), grain_for(1), [&](int64_t s, int64_t e) {
    float u[256], v[256];
    for (int64_t i = s; i < e; i += 256) {
      const int64_t k = std::min<int64_t>(256, e - i);
      widen_span(t, ap + i * 2, u, k);
      widen_span(t, bp + i * 2, v, k);
      for (int64_t j = 0; j < k; ++j) u[j] = f(u[j], v[j]);
      narrow_span(t, u, op + i * 2, k);
    }
  });
}

}  // namespace fanout::kernels::cpu
