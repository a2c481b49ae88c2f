// Floating storage for the CPU kernels that read and write float32,
// bfloat16 or float16 tensors with float32 arithmetic: loads widen (exact),
// stores round to nearest even (runtime/core/half.h), as a GPU kernel on
// __nv_bfloat16 or __half storage does.
#pragma once
#include <algorithm>
#include <cstdint>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

// run(first, k) over [first, first + k) runs of at most kRun elements
// covering [0, n), in parallel: the span loops below keep a run's float32
// values in kRun-element buffers on the stack.
constexpr int64_t kRun = 256;
template <class Run>
void float_runs(const Context& ctx, int64_t n, Run run) {
  parallel_for(ctx, n, grain_for(1), [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; i += kRun) run(i, std::min<int64_t>(kRun, e - i));
  });
}

// n values of type t (float32, bfloat16 or float16) to float32 and back
// (rounded to nearest even); float16 through F16C where the CPU has it.
// kernels/cpu/convert.cpp.
void widen_span(DType t, const void* src, float* dst, int64_t n);
void narrow_span(DType t, const float* src, void* dst, int64_t n);

// widen_span and narrow_span for short runs (a row's few channels): bfloat16
// and float32 inline (into AVX2 clones too), without a call per run.
[[gnu::always_inline]] inline void widen_short(DType t, const void* src, float* dst, int64_t n) {
  if (t == DType::BF16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = half::float_from_bf16(s[i]);
  } else if (t == DType::F32) {
    const float* s = static_cast<const float*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
  } else {
    widen_span(t, src, dst, n);
  }
}
[[gnu::always_inline]] inline void narrow_short(DType t, const float* src, void* dst, int64_t n) {
  if (t == DType::BF16) {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = half::bf16_from_float(src[i]);
  } else if (t == DType::F32) {
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = src[i];
  } else {
    narrow_span(t, src, dst, n);
  }
}

// out = f(a) elementwise over tensors of one storage type and layout; out
// may be a. rows(a, out, n) computes n float32 values (the caller's
// vectorized loop, kernels/cpu/loops.h): float32 tensors' own spans, low
// types widened into kRun-element buffers and rounded as stored, so a low
// type's result is the float32 result rounded. cost: parallel_for's cost
// per element.
template <class Rows>
void storage_map1(const Context& ctx, const Tensor& a, Tensor& out, int64_t cost, Rows rows) {
  if (a.dtype() == DType::F32) {
    const float* ap = a.f32();
    float* op = out.f32();
    return parallel_for(ctx, out.numel(), grain_for(cost), [&](int64_t s, int64_t e) { rows(ap + s, op + s, e - s); });
  }
  const DType t = a.dtype();
  const char* ap = static_cast<const char*>(a.raw());
  char* op = static_cast<char*>(out.raw());
  float_runs(ctx, out.numel(), [&](int64_t i, int64_t k) {
    float buf[kRun];
    widen_span(t, ap + i * 2, buf, k);
    rows(buf, buf, k);
    narrow_span(t, buf, op + i * 2, k);
  });
}

// out = f(a, b) likewise, rows(a, b, out, n); out may be a or b.
template <class Rows>
void storage_map2(const Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, int64_t cost, Rows rows) {
  if (a.dtype() == DType::F32) {
    const float *ap = a.f32(), *bp = b.f32();
    float* op = out.f32();
    return parallel_for(ctx, out.numel(), grain_for(cost),
                        [&](int64_t s, int64_t e) { rows(ap + s, bp + s, op + s, e - s); });
  }
  const DType t = a.dtype();
  const char *ap = static_cast<const char*>(a.raw()), *bp = static_cast<const char*>(b.raw());
  char* op = static_cast<char*>(out.raw());
  float_runs(ctx, out.numel(), [&](int64_t i, int64_t k) {
    float u[kRun], v[kRun];
    widen_span(t, ap + i * 2, u, k);
    widen_span(t, bp + i * 2, v, k);
    rows(u, v, u, k);
    narrow_span(t, u, op + i * 2, k);
  });
}

}  // namespace fanout::kernels::cpu
