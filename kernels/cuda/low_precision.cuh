// The CUDA backend's low-precision path under autocast (ctx.math.autocast =
// BF16 or F16): cuDNN convolutions and cuBLAS GEMMs take their operands in
// the low type, narrowing (rounding) float32 tensors as they read them;
// results come back widened (exact) or added into float32 sums. Kernels
// whose float32 output autocast rounds do it as they write (round_low);
// kernels on low-type storage widen and narrow element by element.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

#include "runtime/core/error.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda::detail {

inline bool low_precision(const Context& ctx) {
  const DType t = ctx.math.autocast;
  FANOUT_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16) << "autocast to " << dtype_name(t);
  return t != DType::F32;
}

// An output's rounding to type t (or to the context's autocast type), for
// kernels to apply as they write: 0 keeps float32, 1 rounds to bfloat16, 2 to
// float16 (nearest even).
inline int low_mode(DType t) { return t == DType::BF16 ? 1 : t == DType::F16 ? 2 : 0; }
inline int low_mode(const Context& ctx) { return low_precision(ctx) ? low_mode(ctx.math.autocast) : 0; }
__device__ __forceinline__ float round_low(float v, int mode) {
  if (mode == 1) return __bfloat162float(__float2bfloat16_rn(v));
  if (mode == 2) return __half2float(__float2half_rn(v));
  return v;
}

// Element storage of the kernels that read and write float32, bfloat16 or
// float16 tensors with float32 arithmetic: loads widen, stores round to
// nearest even.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }

// f(T{}) with T the element type of dtype t: float, __nv_bfloat16 or __half.
template <class F>
void with_storage(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(float{});
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    default: FANOUT_FAIL() << "no floating storage of type " << dtype_name(t);
  }
}

template <class Op, class T>
__global__ void storage_map1_kernel(Op op, const T* a, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = narrow<T>(op(widen(a[i])));
}
template <class Op, class T>
__global__ void storage_map2_kernel(Op op, const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

// out = op(a) (or op(a, b)) over tensors of one storage type and layout, in
// float32, rounded as it is stored; out may alias an input. Float32 takes the
// vectorized map launchers. The caller has made the device current.
template <class Op>
void launch_storage_map1(Context& ctx, const Op& op, const Tensor& a, Tensor& out) {
  if (a.dtype() == DType::F32) return launch_map1(ctx, op, a.f32(), out.f32(), out.numel());
  if (out.numel() == 0) return;
  with_storage(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    storage_map1_kernel<Op, T><<<grid_for(ctx, out.numel()), kThreads, 0, stream_of(ctx)>>>(
        op, a.data<T>(), out.data<T>(), out.numel());
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}
template <class Op>
void launch_storage_map2(Context& ctx, const Op& op, const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.dtype() == DType::F32) return launch_map2(ctx, op, a.f32(), b.f32(), out.f32(), out.numel());
  if (out.numel() == 0) return;
  with_storage(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    storage_map2_kernel<Op, T><<<grid_for(ctx, out.numel()), kThreads, 0, stream_of(ctx)>>>(
        op, a.data<T>(), b.data<T>(), out.data<T>(), out.numel());
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

// out (c) += the sums over N and S of x (N, C, S), stored NC(S) or, with
// `last`, channels-last, in double through channel_reduce_stored's two
// fixed-order passes (a bias gradient; a (rows, c) matrix's column sums are
// n = rows, s = 1, last).
template <class T>
struct ChannelSum {
  template <class I>
  struct Op {
    const T* x;
    __device__ void operator()(I i, I, double& a, double&) const { a += static_cast<double>(widen(x[i])); }
  };
};
struct AddChannelSum {
  float* out;
  __device__ void operator()(int64_t c, double a, double) const { out[c] += static_cast<float>(a); }
};
template <class T>
void channel_sum_add(Context& ctx, const T* x, int64_t n, int64_t c, int64_t s, bool last, float* out) {
  channel_reduce_stored<ChannelSum<T>::template Op>(ctx, n, c, s, last, AddChannelSum{out}, x);
}

// Per context, per role (0, 1: inputs; 2: output; 3: output gradient): a
// low-type buffer of at least the shape, grown and never shrunk, so a warm
// step allocates nothing. Valid until the same role is asked for again.
struct LowBuffers : BackendState {
  Tensor slot[4];
};
inline Tensor low_buffer(Context& ctx, int role, const Shape& s) {
  if (!ctx.backend_state()) ctx.set_backend_state(std::make_unique<LowBuffers>());
  auto* b = dynamic_cast<LowBuffers*>(ctx.backend_state());
  FANOUT_CHECK(b) << "the context on " << ctx.device().str() << " holds another backend's state";
  Tensor& t = b->slot[role];
  const void* before = t.defined() ? t.raw() : nullptr;
  ensure(t, s, ctx.math.autocast, ctx.device());
  if (t.raw() != before) ctx.scratch_moved();
  return t;
}

// Row-major C = alpha op(A) op(B) + beta C through cuBLAS (kernels/cuda/
// gemm.cu), each operand float32 or, under autocast, its low type: float32
// A and B are narrowed as autocast asks, low-type ones read as they are; C
// of the low type is rounded once as cuBLAS writes it; float32
// accumulation. An empty product (k or alpha 0) scales C: by 0 in any
// type, by other factors a float32 C.
void gemm_ex(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
             DType a_type, int64_t lda, const void* b, DType b_type, int64_t ldb, float beta, void* c, DType c_type,
             int64_t ldc);

// dst (low type, n elements) = src narrowed; kernels/cuda/convert.cu.
void narrow_into(Context& ctx, const float* src, Tensor& dst, int64_t n);
// dst (float32) += widen(src), over src's elements.
void add_widened(Context& ctx, const Tensor& src, float* dst);

// A float32 tensor's values as a low-type copy in `role`'s buffer.
inline Tensor narrowed(Context& ctx, int role, const Tensor& t) {
  Tensor l = low_buffer(ctx, role, t.shape());
  narrow_into(ctx, t.f32(), l, t.numel());
  return l;
}

}  // namespace fanout::kernels::cuda::detail
