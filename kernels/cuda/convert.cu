// CUDA conversions through the hardware's round-to-nearest-even intrinsics
// (__float2bfloat16_rn, __float2half_rn), the same values as
// kernels/cpu/convert.cpp (NaN payloads may differ; NaN stays NaN).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

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

// Channels-last transposes of (n, c, s) planes through 32 x 32 shared tiles,
// blocks of 32 x 8 threads: both the read and the write run along
// consecutive addresses. grid (s tiles, c tiles, batches, looped past z's limit).
constexpr int kTile = 32, kTileRows = 8;

template <class Low>
__global__ void narrow_channels_last_kernel(const float* __restrict__ src, Low* __restrict__ dst, int64_t n,
                                            int64_t c, int64_t s) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.y} * kTile, s0 = int64_t{blockIdx.x} * kTile;
  for (int64_t b = blockIdx.z; b < n; b += gridDim.z) {
    const float* x = src + b * c * s;
    Low* d = dst + b * s * c;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // rows: channels; along s
      const int64_t ci = c0 + j, si = s0 + threadIdx.x;
      if (ci < c && si < s) tile[j][threadIdx.x] = x[ci * s + si];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // rows: positions; along c
      const int64_t si = s0 + j, ci = c0 + threadIdx.x;
      if (ci < c && si < s) d[si * c + ci] = narrow<Low>(tile[threadIdx.x][j]);
    }
    __syncthreads();
  }
}

template <class Low>
__global__ void widen_channels_first_kernel(const Low* __restrict__ src, float* __restrict__ dst, int64_t n,
                                            int64_t c, int64_t s, bool accumulate) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.y} * kTile, s0 = int64_t{blockIdx.x} * kTile;
  for (int64_t b = blockIdx.z; b < n; b += gridDim.z) {
    const Low* x = src + b * s * c;
    float* d = dst + b * c * s;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // rows: positions; along c
      const int64_t si = s0 + j, ci = c0 + threadIdx.x;
      if (ci < c && si < s) tile[j][threadIdx.x] = widen(x[si * c + ci]);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // rows: channels; along s
      const int64_t ci = c0 + j, si = s0 + threadIdx.x;
      if (ci < c && si < s) {
        const float v = tile[threadIdx.x][j];
        d[ci * s + si] = accumulate ? d[ci * s + si] + v : v;
      }
    }
    __syncthreads();
  }
}

// launch(Low{}, grid, block, stream) for a channels-first shape (n, c, s...)
// and the low type t.
template <class Launch>
void for_low_tiles(Context& ctx, DType t, const Shape& first, Launch&& launch) {
  const int64_t n = first[0], c = first[1], s = first.numel() / (n * c);
  const int64_t c_tiles = (c + kTile - 1) / kTile, s_tiles = (s + kTile - 1) / kTile;
  FANOUT_CHECK(c_tiles <= 65535 && s_tiles <= INT32_MAX)
      << "channels-last copy of " << first.str() << ": too many channels or positions for one grid";
  detail::DeviceScope scope(ctx);
  const dim3 grid(static_cast<unsigned>(s_tiles), static_cast<unsigned>(c_tiles),
                  static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  const dim3 block(kTile, kTileRows);
  cudaStream_t st = detail::stream_of(ctx);
  if (t == DType::BF16)
    launch(__nv_bfloat16{}, grid, block, st, n, c, s);
  else
    launch(__half{}, grid, block, st, n, c, s);
  FANOUT_CUDA_CHECK_LAUNCH();
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

void narrow_channels_last(Context& ctx, const Tensor& src, Tensor& dst) {
  for_low_tiles(ctx, dst.dtype(), src.shape(),
                [&](auto low, dim3 grid, dim3 block, cudaStream_t st, int64_t n, int64_t c, int64_t s) {
                  using Low = decltype(low);
                  narrow_channels_last_kernel<Low><<<grid, block, 0, st>>>(src.f32(), dst.data<Low>(), n, c, s);
                });
}

void widen_channels_first(Context& ctx, const Tensor& src, Tensor& dst, bool accumulate) {
  for_low_tiles(ctx, src.dtype(), dst.shape(),
                [&](auto low, dim3 grid, dim3 block, cudaStream_t st, int64_t n, int64_t c, int64_t s) {
                  using Low = decltype(low);
                  widen_channels_first_kernel<Low>
                      <<<grid, block, 0, st>>>(src.data<Low>(), dst.f32(), n, c, s, accumulate);
                });
}

void round_to(Context& ctx, Tensor& x, DType t) {
  for_low(ctx, t, x.numel(), [&](auto low, int grid, cudaStream_t st) {
    round_kernel<decltype(low)><<<grid, detail::kThreads, 0, st>>>(x.f32(), x.numel());
  });
}

}  // namespace fanout::kernels::cuda
