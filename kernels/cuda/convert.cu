// CUDA conversions through the hardware's round-to-nearest-even intrinsics
// (__float2bfloat16_rn, __float2half_rn), the same values as
// kernels/cpu/convert.cpp (NaN payloads may differ; NaN stays NaN).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/convert.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

template <class Low>
__device__ __forceinline__ Low narrow(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }

template <class Low>
__global__ void narrow_kernel(const float* s, Low* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d[i] = narrow<Low>(s[i]);
}
template <class Low>
__global__ void widen_kernel(const Low* s, float* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d[i] = widen(s[i]);
}
template <class Low>
__global__ void round_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = widen(narrow<Low>(x[i]));
}

template <class Low>
__global__ void add_widened_kernel(const Low* s, float* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d[i] += widen(s[i]);
}

// launch(Low{}, grid, stream) for the low type t (BF16 or F16) over n
// elements, on the context's device and compute stream.
template <class Launch>
void for_low(Context& ctx, DType t, int64_t n, Launch&& launch) {
  if (n == 0) return;
  detail::DeviceScope scope(ctx);
  const int grid = detail::grid_for(ctx, n);
  cudaStream_t st = detail::stream_of(ctx);
  if (t == DType::BF16)
    launch(__nv_bfloat16{}, grid, st);
  else
    launch(__half{}, grid, st);
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  if (src.dtype() == DType::F32) return detail::narrow_into(ctx, src.f32(), dst, src.numel());
  for_low(ctx, src.dtype(), src.numel(), [&](auto low, int grid, cudaStream_t st) {
    using Low = decltype(low);
    widen_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src.data<Low>(), dst.f32(), src.numel());
  });
}

void detail::narrow_into(Context& ctx, const float* src, Tensor& dst, int64_t n) {
  for_low(ctx, dst.dtype(), n, [&](auto low, int grid, cudaStream_t st) {
    using Low = decltype(low);
    narrow_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src, dst.data<Low>(), n);
  });
}

void detail::add_widened(Context& ctx, const Tensor& src, float* dst) {
  for_low(ctx, src.dtype(), src.numel(), [&](auto low, int grid, cudaStream_t st) {
    using Low = decltype(low);
    add_widened_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src.data<Low>(), dst, src.numel());
  });
}

void round_to(Context& ctx, Tensor& x, DType t) {
  for_low(ctx, t, x.numel(), [&](auto low, int grid, cudaStream_t st) {
    round_kernel<decltype(low)><<<grid, detail::kThreads, 0, st>>>(x.f32(), x.numel());
  });
}

}  // namespace fanout::kernels::cuda
