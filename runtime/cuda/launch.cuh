// The one elementwise launch path of the CUDA code (C++17, .cu files only):
// launch sizes and the grid-stride map kernels, out[i] = op(a[i]) or
// op(a[i], b[i]) over float32 arrays, with a float4 path when every pointer
// is 16-byte aligned. Outputs may alias inputs (each element is read and
// written by the same thread), so no __restrict__. Used by the kernels
// (kernels/cuda/common.cuh wraps them for a Context) and by the runtime's
// fill and communicator add (runtime/cuda/elementwise.cu).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"

namespace fanout::cuda_launch {

constexpr int kThreads = 256;  // threads per block of the elementwise kernels

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Streaming multiprocessors of a device, cached (the attribute query is cheap
// but sits on every launch).
inline int sm_count(int device) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64) {
    const int c = cache[device].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int n = 0;
  FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  n = std::max(n, 1);
  if (device >= 0 && device < 64) cache[device].store(n, std::memory_order_relaxed);
  return n;
}

// Blocks for a grid-stride loop over `n` items on `device`: enough to fill it
// several times over, never zero, never past the grid limit.
inline int grid_for(int device, int64_t n, int threads = kThreads) {
  const int64_t cap = int64_t{sm_count(device)} * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ceil_div(std::max<int64_t>(n, 1), threads), cap)));
}

// True when every pointer is 16-byte aligned (float4 loads and stores).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
template <class... P>
inline bool aligned16(const void* p, P... rest) {
  return aligned16(p) && aligned16(rest...);
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

// Launchers: the caller has made `device` current; the launch is checked.
template <class Op>
void map2(int device, cudaStream_t st, const Op& op, const float* a, const float* b, float* out, int64_t n) {
  if (n <= 0) return;
  if (aligned16(a, b, out)) {
    map2_kernel<Op, true><<<grid_for(device, ceil_div(n, 4)), kThreads, 0, st>>>(op, a, b, out, n);
  } else {
    map2_kernel<Op, false><<<grid_for(device, n), kThreads, 0, st>>>(op, a, b, out, n);
  }
  FANOUT_CUDA_CHECK_LAUNCH();
}

// op over one input: the binary kernel with b = a, whose second load the
// compiler drops since Unary ignores it.
template <class Op>
struct Unary {
  Op op;
  __device__ float operator()(float a, float) const { return op(a); }
};

template <class Op>
void map1(int device, cudaStream_t st, const Op& op, const float* a, float* out, int64_t n) {
  map2(device, st, Unary<Op>{op}, a, a, out, n);
}

}  // namespace fanout::cuda_launch
