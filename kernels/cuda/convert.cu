// CUDA conversions through the hardware's round-to-nearest-even intrinsics
// (__float2bfloat16_rn, __float2half_rn), the same values as
// kernels/cpu/convert.cpp (NaN payloads may differ; NaN stays NaN).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/convert.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

using detail::narrow;
using detail::widen;

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
template <class In, class Out>
__global__ void recast_kernel(const In* s, Out* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    d[i] = narrow<Out>(widen(s[i]));
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

// The square-tile copies (the default; bench/RESULTS.md, "2026-11-28,
// session 25"): a batch of row-major (rows, cols) planes written as (cols,
// rows) planes, converted on the way (to the output's type; float outputs may
// accumulate), through 32 x 32 shared tiles
// and blocks of 32 x 8 threads so that reads and writes both run along
// consecutive addresses. grid (column tiles, row tiles, batches); the last two
// loop past their launch limits.
constexpr int kTile = 32, kTileRows = 8;

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

// Wide-tile copies (FANOUT_CUDA_CL_COPIES=wide; to be measured against the
// square tiles on a GPU): a batch of (c, s) float planes to (s, c) low-type
// planes and back. A block moves one tile of tc channels by ts positions
// through shared memory (an odd row pitch: no bank conflicts down a column),
// about 2048 values: with 64 channels or more ts is 32, or s itself when
// s < 32 (the tile's float rows are then one contiguous run) with tc growing
// as ts shrinks; under 64 channels the tile takes them all and its rows grow
// instead. The low-type side moves two channels per 4-byte access when c is
// even. grid (tiles, batches); batches loop past the launch limit.
constexpr int kCopyThreads = 256, kTileValues = 2048;

struct TileGeometry {
  int tc, ts;
  int64_t c_tiles, s_tiles;
};
TileGeometry tile_geometry(int64_t c, int64_t s) {
  if (c < 64) {  // one channel tile; its rows grow to fill the tile
    const int ts = static_cast<int>(std::min<int64_t>(s, std::max<int64_t>(32, kTileValues / c / 32 * 32)));
    return {static_cast<int>(c), ts, 1, (s + ts - 1) / ts};
  }
  const int ts = static_cast<int>(std::min<int64_t>(s, 32));
  const int tc = std::clamp(kTileValues / ts / 64 * 64, 64, 512);
  return {tc, ts, (c + tc - 1) / tc, (s + ts - 1) / ts};
}

// (row, col) over a rows x cols range, each thread starting at its index and
// stepping by the block's size.
struct Walk {
  int row, col, cols, step_rows, step_cols;
  __device__ Walk(int cols_, int start, int step)
      : row(start / cols_), col(start % cols_), cols(cols_), step_rows(step / cols_), step_cols(step % cols_) {}
  __device__ void next() {
    row += step_rows;
    col += step_cols;
    if (col >= cols) col -= cols, ++row;
  }
};

// This block's tile: first channel and position, how many of each it holds
// (the last tiles are partial), and its shared row pitch (odd).
struct TileAt {
  int64_t c0, s0;
  int tcv, tsv, pitch;
  __device__ TileAt(int64_t c, int64_t s, int tc, int ts, int64_t s_tiles)
      : c0(blockIdx.x / s_tiles * tc),
        s0(blockIdx.x % s_tiles * ts),
        tcv(static_cast<int>(c - c0 < tc ? c - c0 : tc)),
        tsv(static_cast<int>(s - s0 < ts ? s - s0 : ts)),
        pitch(ts | 1) {}
};

template <class Low>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ static type narrow(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static float2 widen(type v) { return __bfloat1622float2(v); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  __device__ static type narrow(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static float2 widen(type v) { return __half22float2(v); }
};

template <class Low>
__global__ void __launch_bounds__(kCopyThreads)
    narrow_last_kernel(const float* __restrict__ src, Low* __restrict__ dst, int64_t n, int64_t c, int64_t s, int tc,
                       int ts, int64_t s_tiles, bool pairs) {
  extern __shared__ float buf[];
  const TileAt t(c, s, tc, ts, s_tiles);
  const int pitch = t.pitch, tcv = t.tcv, tsv = t.tsv;
  for (int64_t b = blockIdx.y; b < n; b += gridDim.y) {
    const float* x = src + (b * c + t.c0) * s + t.s0;  // channel row r at x + r * s
    Low* d = dst + (b * s + t.s0) * c + t.c0;          // position row r at d + r * c
    for (Walk w(tsv, threadIdx.x, kCopyThreads); w.row < tcv; w.next())
      buf[w.row * pitch + w.col] = x[w.row * s + w.col];
    __syncthreads();
    if (pairs) {
      for (Walk w(tcv / 2, threadIdx.x, kCopyThreads); w.row < tsv; w.next()) {
        const int k = 2 * w.col;
        *reinterpret_cast<typename Pair<Low>::type*>(d + w.row * c + k) =
            Pair<Low>::narrow(buf[k * pitch + w.row], buf[(k + 1) * pitch + w.row]);
      }
    } else {
      for (Walk w(tcv, threadIdx.x, kCopyThreads); w.row < tsv; w.next())
        d[w.row * c + w.col] = narrow<Low>(buf[w.col * pitch + w.row]);
    }
    __syncthreads();
  }
}

template <class Low>
__global__ void __launch_bounds__(kCopyThreads)
    widen_first_kernel(const Low* __restrict__ src, float* __restrict__ dst, int64_t n, int64_t c, int64_t s, int tc,
                       int ts, int64_t s_tiles, bool pairs, bool accumulate) {
  extern __shared__ float buf[];
  const TileAt t(c, s, tc, ts, s_tiles);
  const int pitch = t.pitch, tcv = t.tcv, tsv = t.tsv;
  for (int64_t b = blockIdx.y; b < n; b += gridDim.y) {
    const Low* x = src + (b * s + t.s0) * c + t.c0;  // position row r at x + r * c
    float* d = dst + (b * c + t.c0) * s + t.s0;      // channel row r at d + r * s
    if (pairs) {
      for (Walk w(tcv / 2, threadIdx.x, kCopyThreads); w.row < tsv; w.next()) {
        const int k = 2 * w.col;
        const float2 v = Pair<Low>::widen(*reinterpret_cast<const typename Pair<Low>::type*>(x + w.row * c + k));
        buf[k * pitch + w.row] = v.x;
        buf[(k + 1) * pitch + w.row] = v.y;
      }
    } else {
      for (Walk w(tcv, threadIdx.x, kCopyThreads); w.row < tsv; w.next())
        buf[w.col * pitch + w.row] = widen(x[w.row * c + w.col]);
    }
    __syncthreads();
    for (Walk w(tsv, threadIdx.x, kCopyThreads); w.row < tcv; w.next()) {
      float* p = d + w.row * s + w.col;
      const float v = buf[w.row * pitch + w.col];
      *p = accumulate ? *p + v : v;
    }
    __syncthreads();
  }
}

// Launch geometry of one channels-last copy.
struct CopyLaunch {
  TileGeometry g;
  dim3 grid;
  size_t shared;
};
CopyLaunch copy_launch(int64_t n, int64_t c, int64_t s) {
  const TileGeometry g = tile_geometry(c, s);
  FANOUT_CHECK(g.c_tiles * g.s_tiles <= INT32_MAX) << "channels-last copy: (" << c << ", " << s
                                                   << ") planes need too many tiles for one grid";
  return {g, dim3(static_cast<unsigned>(g.c_tiles * g.s_tiles), static_cast<unsigned>(std::min<int64_t>(n, 65535))),
          static_cast<size_t>(g.tc) * (g.ts | 1) * sizeof(float)};
}

bool even_and_aligned(int64_t c, const void* p) { return c % 2 == 0 && (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

// FANOUT_CUDA_CL_COPIES: square (default) or wide.
bool wide_copies() {
  static const bool yes = [] {
    const char* v = std::getenv("FANOUT_CUDA_CL_COPIES");
    const std::string kind = v ? v : "square";
    FANOUT_USER_CHECK(kind == "square" || kind == "wide")
        << "FANOUT_CUDA_CL_COPIES must be square or wide, not '" << kind << "'";
    return kind == "wide";
  }();
  return yes;
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
  const DType sd = src.dtype(), dd = dst.dtype();
  if (src.format() == dst.format()) {  // the same order in memory
    if (sd == dd) {
      detail::DeviceScope scope(ctx);
      FANOUT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice,
                                        detail::stream_of(ctx)));
      return;
    }
    if (sd == DType::F32) return detail::narrow_into(ctx, src.f32(), dst, src.numel());
    if (dd == DType::F32) {
      for_low(ctx, sd, src.numel(), [&](auto low, int grid, cudaStream_t st) {
        using Low = decltype(low);
        widen_kernel<Low><<<grid, detail::kThreads, 0, st>>>(src.data<Low>(), dst.f32(), src.numel());
      });
      return;
    }
  }
  const detail::Planes p = detail::planes_of(src);  // logical (n, c, s)
  const bool same = src.format() == dst.format(), to_last = dst.channels_last();
  detail::with_storage(sd, [&](auto in_tag) {
    detail::with_storage(dd, [&](auto out_tag) {
      using In = decltype(in_tag);
      using Out = decltype(out_tag);
      if (same) {  // bfloat16 to float16 or back, in memory order
        detail::DeviceScope scope(ctx);
        recast_kernel<In, Out><<<detail::grid_for(ctx, src.numel()), detail::kThreads, 0, detail::stream_of(ctx)>>>(
            src.data<In>(), dst.data<Out>(), src.numel());
        FANOUT_CUDA_CHECK_LAUNCH();
      } else if (to_last) {  // (n, c, s) planes -> (n, s, c)
        transpose(ctx, src.data<In>(), dst.data<Out>(), p.n, p.c, p.s, false);
      } else {
        transpose(ctx, src.data<In>(), dst.data<Out>(), p.n, p.s, p.c, false);
      }
    });
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
  const detail::Planes p = detail::planes_of(src);  // (n, c, s) planes -> (n, s, c)
  const int64_t n = p.n, c = p.c, s = p.s;  // plain names: lambdas capture them
  if (!wide_copies()) {
    if (dst.dtype() == DType::BF16) return transpose(ctx, src.f32(), dst.data<__nv_bfloat16>(), n, c, s, false);
    return transpose(ctx, src.f32(), dst.data<__half>(), n, c, s, false);
  }
  if (s == 1 || c == 1) return detail::narrow_into(ctx, src.f32(), dst, src.numel());  // the same order
  if (src.numel() == 0) return;
  const CopyLaunch l = copy_launch(n, c, s);
  const bool pairs = even_and_aligned(c, dst.raw());
  for_low(ctx, dst.dtype(), src.numel(), [&](auto low, int, cudaStream_t st) {
    using Low = decltype(low);
    narrow_last_kernel<<<l.grid, kCopyThreads, l.shared, st>>>(src.f32(), dst.data<Low>(), n, c, s, l.g.tc, l.g.ts,
                                                               l.g.s_tiles, pairs);
  });
}

void widen_channels_first(Context& ctx, const Tensor& src, Tensor& dst, bool accumulate) {
  const detail::Planes p = detail::planes_of(dst);  // (n, s, c) planes -> (n, c, s)
  const int64_t n = p.n, c = p.c, s = p.s;
  if (!wide_copies()) {
    if (src.dtype() == DType::BF16)
      return transpose(ctx, src.data<__nv_bfloat16>(), dst.f32(), n, s, c, accumulate);
    return transpose(ctx, src.data<__half>(), dst.f32(), n, s, c, accumulate);
  }
  if (s == 1 || c == 1) return accumulate ? detail::add_widened(ctx, src, dst.f32()) : convert(ctx, src, dst);
  if (dst.numel() == 0) return;
  const CopyLaunch l = copy_launch(n, c, s);
  const bool pairs = even_and_aligned(c, src.raw());
  for_low(ctx, src.dtype(), dst.numel(), [&](auto low, int, cudaStream_t st) {
    using Low = decltype(low);
    widen_first_kernel<<<l.grid, kCopyThreads, l.shared, st>>>(src.data<Low>(), dst.f32(), n, c, s, l.g.tc, l.g.ts,
                                                               l.g.s_tiles, pairs, accumulate);
  });
}

void round_to(Context& ctx, Tensor& x, DType t) {
  for_low(ctx, t, x.numel(), [&](auto low, int grid, cudaStream_t st) {
    round_kernel<decltype(low)><<<grid, detail::kThreads, 0, st>>>(x.f32(), x.numel());
  });
}

}  // namespace fanout::kernels::cuda
