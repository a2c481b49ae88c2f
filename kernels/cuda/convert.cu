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

template <class Low>
void run_convert(Context& ctx, const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  const int grid = detail::grid_for(ctx, n);
  cudaStream_t st = detail::stream_of(ctx);
  if (src.dtype() == DType::F32)
    narrow_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src.f32(), dst.data<Low>(), n);
  else
    widen_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src.data<Low>(), dst.f32(), n);
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void convert(Context& ctx, const Tensor& src, Tensor& dst) {
  detail::DeviceScope scope(ctx);
  const DType low = src.dtype() == DType::F32 ? dst.dtype() : src.dtype();
  if (low == DType::BF16)
    run_convert<__nv_bfloat16>(ctx, src, dst);
  else
    run_convert<__half>(ctx, src, dst);
}

void detail::narrow_into(Context& ctx, const float* src, Tensor& dst, int64_t n) {
  if (n == 0) return;
  detail::DeviceScope scope(ctx);
  const int grid = detail::grid_for(ctx, n);
  cudaStream_t st = detail::stream_of(ctx);
  if (dst.dtype() == DType::BF16)
    narrow_kernel<__nv_bfloat16><<<grid, detail::kThreads, 0, st>>>(src, dst.data<__nv_bfloat16>(), n);
  else
    narrow_kernel<__half><<<grid, detail::kThreads, 0, st>>>(src, dst.data<__half>(), n);
  FANOUT_CUDA_CHECK_LAUNCH();
}

void detail::add_widened(Context& ctx, const Tensor& src, float* dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  detail::DeviceScope scope(ctx);
  const int grid = detail::grid_for(ctx, n);
  cudaStream_t st = detail::stream_of(ctx);
  if (src.dtype() == DType::BF16)
    add_widened_kernel<__nv_bfloat16><<<grid, detail::kThreads, 0, st>>>(src.data<__nv_bfloat16>(), dst, n);
  else
    add_widened_kernel<__half><<<grid, detail::kThreads, 0, st>>>(src.data<__half>(), dst, n);
  FANOUT_CUDA_CHECK_LAUNCH();
}

void round_to(Context& ctx, Tensor& x, DType t) {
  detail::DeviceScope scope(ctx);
  const int64_t n = x.numel();
  const int grid = detail::grid_for(ctx, n);
  cudaStream_t st = detail::stream_of(ctx);
  if (t == DType::BF16)
    round_kernel<__nv_bfloat16><<<grid, detail::kThreads, 0, st>>>(x.f32(), n);
  else
    round_kernel<__half><<<grid, detail::kThreads, 0, st>>>(x.f32(), n);
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
