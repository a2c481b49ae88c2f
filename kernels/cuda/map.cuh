// Private elementwise "map" kernels of the CUDA backend (C++17): out[i] =
// op(a[i]) or op(a[i], b[i]) over float32 arrays, grid-stride, with a float4
// path when every pointer is 16-byte aligned. Outputs may alias inputs (each
// element is read and written by the same thread), so no __restrict__.
#pragma once
#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda::detail {

template <class Op, bool kVec>
__global__ void map1_kernel(Op op, const float* a, float* out, int64_t n) {
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t begin = 0;
  if (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = tid; i < n4; i += stride) {
      float4 v = a4[i];
      v.x = op(v.x);
      v.y = op(v.y);
      v.z = op(v.z);
      v.w = op(v.w);
      o4[i] = v;
    }
    begin = n4 * 4;
  }
  for (int64_t i = begin + tid; i < n; i += stride) out[i] = op(a[i]);
}

template <class Op, bool kVec>
__global__ void map2_kernel(Op op, const float* a, const float* b, float* out, int64_t n) {
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t begin = 0;
  if (kVec) {
    const int64_t n4 = n / 4;
    const float4* a4 = reinterpret_cast<const float4*>(a);
    const float4* b4 = reinterpret_cast<const float4*>(b);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = tid; i < n4; i += stride) {
      const float4 u = a4[i];
      const float4 v = b4[i];
      o4[i] = make_float4(op(u.x, v.x), op(u.y, v.y), op(u.z, v.z), op(u.w, v.w));
    }
    begin = n4 * 4;
  }
  for (int64_t i = begin + tid; i < n; i += stride) out[i] = op(a[i], b[i]);
}

// Launchers: the caller has made the context's device current.
template <class Op>
void launch_map1(Context& ctx, const Op& op, const float* a, float* out, int64_t n) {
  if (n <= 0) return;
  cudaStream_t st = stream_of(ctx);
  if (aligned16(a, out)) {
    map1_kernel<Op, true><<<grid_for(ctx, ceil_div(n, 4)), kThreads, 0, st>>>(op, a, out, n);
  } else {
    map1_kernel<Op, false><<<grid_for(ctx, n), kThreads, 0, st>>>(op, a, out, n);
  }
  FANOUT_CUDA_CHECK_LAUNCH();
}

template <class Op>
void launch_map2(Context& ctx, const Op& op, const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return;
  cudaStream_t st = stream_of(ctx);
  if (aligned16(a, b, out)) {
    map2_kernel<Op, true><<<grid_for(ctx, ceil_div(n, 4)), kThreads, 0, st>>>(op, a, b, out, n);
  } else {
    map2_kernel<Op, false><<<grid_for(ctx, n), kThreads, 0, st>>>(op, a, b, out, n);
  }
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda::detail
