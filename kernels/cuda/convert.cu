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

// A batch of row-major (rows, cols) planes written as (cols, rows) planes,
// converted on the way (to the output's type; float outputs may accumulate),
// through 32 x 32 shared tiles and blocks of 32 x 8 threads so that reads and
// writes both run along consecutive addresses. grid (column tiles, row tiles,
// batches); the last two loop past their launch limits.
constexpr int kTile = 32, kTileRows = 8;

__device__ __forceinline__ float widen(float v) { return v; }
template <class Low>
__device__ __forceinline__ void put(Low* d, float v, bool) { *d = narrow<Low>(v); }
__device__ __forceinline__ void put(float* d, float v, bool accumulate) { *d = accumulate ? *d + v : v; }

template <class In, class Out>
__global__ void transpose_kernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t n, int64_t rows,
                                 int64_t cols, bool accumulate) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile, row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t b = blockIdx.z; b < n; b += gridDim.z)
    for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
      const int64_t r0 = rt * kTile;
      const In* x = src + b * rows * cols;
      Out* d = dst + b * rows * cols;
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // along a row of src
        const int64_t r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[j][threadIdx.x] = widen(x[r * cols + c]);
      }
      __syncthreads();
      for (int j = threadIdx.y; j < kTile; j += kTileRows) {  // along a row of dst
        const int64_t c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) put(d + c * rows + r, tile[threadIdx.x][j], accumulate);
      }
      __syncthreads();
    }
}

template <class In, class Out>
void transpose(Context& ctx, const In* src, Out* dst, int64_t n, int64_t rows, int64_t cols, bool accumulate) {
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  FANOUT_CHECK(col_tiles <= INT32_MAX) << "channels-last copy: " << cols << " columns are too many for one grid";
  detail::DeviceScope scope(ctx);
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(std::min<int64_t>(row_tiles, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(n, 65535)));
  transpose_kernel<In, Out><<<grid, dim3(kTile, kTileRows), 0, detail::stream_of(ctx)>>>(src, dst, n, rows, cols,
                                                                                          accumulate);
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
  const auto [n, c, s] = detail::planes_of(src);  // (n, c, s) planes -> (n, s, c)
  if (dst.dtype() == DType::BF16) return transpose(ctx, src.f32(), dst.data<__nv_bfloat16>(), n, c, s, false);
  transpose(ctx, src.f32(), dst.data<__half>(), n, c, s, false);
}

void widen_channels_first(Context& ctx, const Tensor& src, Tensor& dst, bool accumulate) {
  const auto [n, c, s] = detail::planes_of(dst);  // (n, s, c) planes -> (n, c, s)
  if (src.dtype() == DType::BF16)
    return transpose(ctx, src.data<__nv_bfloat16>(), dst.f32(), n, s, c, accumulate);
  transpose(ctx, src.data<__half>(), dst.f32(), n, s, c, accumulate);
}

void round_to(Context& ctx, Tensor& x, DType t) {
  for_low(ctx, t, x.numel(), [&](auto low, int grid, cudaStream_t st) {
    round_kernel<decltype(low)><<<grid, detail::kThreads, 0, st>>>(x.f32(), x.numel());
  });
}

}  // namespace fanout::kernels::cuda
