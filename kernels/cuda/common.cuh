// Private helpers of the CUDA kernels (C++17, included by kernels/cuda/*.cu
// only): device scope, stream access, launch sizes and map launchers on a
// Context (runtime/cuda/launch.cuh underneath), warp and block reductions,
// the index-type dispatch, and the deterministic per-channel reduction shared
// by batch norm and the convolution bias gradient.
#pragma once
#include <cuda_runtime.h>
#include <math_constants.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch.cuh"

namespace fanout::kernels::cuda::detail {

// Makes the context's device current for the scope of one op and restores the
// previous device after it: worker threads of several devices may share a
// process, and a caller's thread keeps the device it had. Never throws on exit.
class DeviceScope {
 public:
  explicit DeviceScope(const Context& ctx) {
    const int d = ctx.device().index;
    FANOUT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != d) FANOUT_CUDA_CHECK(cudaSetDevice(d));
    device_ = d;
  }
  ~DeviceScope() {
    if (prev_ >= 0 && prev_ != device_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
  int device_ = -1;
};

inline cudaStream_t stream_of(Context& ctx) { return static_cast<cudaStream_t>(ctx.compute().handle()); }

using cuda_launch::aligned16;
using cuda_launch::ceil_div;
using cuda_launch::kThreads;
using cuda_launch::sm_count;

// Blocks for a grid-stride loop over `n` items on the context's device.
inline int grid_for(const Context& ctx, int64_t n, int threads = kThreads) {
  return cuda_launch::grid_for(ctx.device().index, n, threads);
}

// The shared map launchers (runtime/cuda/launch.cuh) on the context's
// compute stream; the caller has made the context's device current.
template <class Op>
void launch_map1(Context& ctx, const Op& op, const float* a, float* out, int64_t n) {
  cuda_launch::map1(ctx.device().index, stream_of(ctx), op, a, out, n);
}
template <class Op>
void launch_map2(Context& ctx, const Op& op, const float* a, const float* b, float* out, int64_t n) {
  cuda_launch::map2(ctx.device().index, stream_of(ctx), op, a, b, out, n);
}

// Calls f(int32_t{}) when every index below `n` fits in 32 bits, else
// f(int64_t{}): kernels that divide indices run their 32-bit version whenever
// they can (64-bit division is emulated and costs more than the memory access).
template <class F>
inline void dispatch_index(int64_t n, F&& f) {
  // Half the 32-bit range, so that grid-stride increments cannot overflow.
  if (n <= int64_t{INT32_MAX} / 2) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

// A grid-stride kernel over `total` outputs on the context's device and
// compute stream: launch(I{}, blocks, stream) with I the index type of
// dispatch_index(max(extent, total)), then the launch check. An empty output
// launches nothing.
template <class Launch>
void launch_per_element(Context& ctx, int64_t total, int64_t extent, Launch&& launch) {
  if (total == 0) return;
  DeviceScope scope(ctx);
  dispatch_index(std::max(extent, total), [&](auto tag) {
    launch(tag, grid_for(ctx, total), stream_of(ctx));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

// This thread's indices of a grid-stride loop over [0, total):
//   for (I i : grid_stride(total)) ...
// (I from dispatch_index, so the increments cannot overflow.)
template <class I>
struct GridStride {
  struct It {
    I i, step;
    __device__ I operator*() const { return i; }
    __device__ It& operator++() {
      i += step;
      return *this;
    }
    __device__ bool operator!=(const It& end) const { return i < end.i; }
  };
  I total;
  __device__ It begin() const {
    return {static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x),
            static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)};
  }
  __device__ It end() const { return {total, 0}; }
};
template <class I>
__device__ __forceinline__ GridStride<I> grid_stride(I total) {
  return {total};
}

// ---- device-side reductions ----

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;  // lane 0 holds the sum
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;  // every lane holds the max (NaN is ignored, as by fmaxf)
}

// Row kernels with one block a row: threads per block, a warp per 32
// entries, up to kMaxRowThreads.
inline constexpr int kMaxRowThreads = 256;
inline int row_threads(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, kMaxRowThreads));
}

// The block's max of v, in every thread (NaN ignored, as by fmaxf and the CPU's
// comparisons). Every thread of the block must call it.
__device__ __forceinline__ float block_max_all(float v) {
  __shared__ float part[32];
  __shared__ float out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_max(lane < warps ? part[lane] : -CUDART_INF_F);
    if (lane == 0) out = v;
  }
  __syncthreads();
  v = out;
  __syncthreads();  // part and out may be reused by a later call
  return v;
}

// Sums a and b over the block; thread 0 gets the results. blockDim.x must be a
// multiple of 32 and at most 1024. Every thread of the block must call it.
template <class T>
__device__ __forceinline__ void block_sum2(T& a, T& b) {
  __shared__ T sa[32];
  __shared__ T sb[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    a = lane < warps ? sa[lane] : T(0);
    b = lane < warps ? sb[lane] : T(0);
    a = warp_sum(a);
    b = warp_sum(b);
  }
  __syncthreads();  // the shared arrays may be reused by a later call
}

// The block's sums of a and b, in every thread (block_sum2's fixed tree).
__device__ __forceinline__ void block_sum2_all(double& a, double& b) {
  __shared__ double out[2];
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    out[0] = a;
    out[1] = b;
  }
  __syncthreads();
  a = out[0];
  b = out[1];
  __syncthreads();
}

// ---- row normalization (GroupNorm, LayerNorm; kernels/cpu/norm_rows.h) ----

// The block's row x[0, m): its mean and 1 / sqrt(var + eps), two passes in
// double reduced in block_sum2's fixed tree, in every thread.
__device__ __forceinline__ void block_row_moments(const float* x, int64_t m, float eps, double& mu, double& r) {
  double sum = 0, unused = 0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) sum += x[k];
  block_sum2_all(sum, unused);
  mu = sum / static_cast<double>(m);
  double sq = 0;
  unused = 0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) sq += (x[k] - mu) * (x[k] - mu);
  block_sum2_all(sq, unused);
  r = 1.0 / sqrt(sq / static_cast<double>(m) + eps);
}

// The block's row gradient, written (=; dx may alias dy), in double:
// dx = r * (dy g - mean(dy g) - xhat * mean(dy g xhat)), g = gamma(k).
template <class Gamma>
__device__ __forceinline__ void block_row_dx(const float* x, const float* dy, int64_t m, double mu, double r,
                                             const Gamma& gamma, float* dx) {
  double sd = 0, sdx = 0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const double dxh = static_cast<double>(dy[k]) * gamma(k);
    sd += dxh;
    sdx += dxh * ((x[k] - mu) * r);
  }
  block_sum2_all(sd, sdx);
  const double inv_m = 1.0 / static_cast<double>(m);
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const double xh = (x[k] - mu) * r;
    dx[k] = static_cast<float>(r * (static_cast<double>(dy[k]) * gamma(k) - inv_m * sd - xh * inv_m * sdx));
  }
}

// ---- deterministic per-channel reduction over (N, C, S) ----
//
// For each channel c, accumulates two doubles over the N*S elements
// x[(n*C + c)*S + s]. Op: __device__ void operator()(I i, I c, double& a, double& b) const.
// Pass 1 (grid C x P) writes per-block partial sums into scratch (2, C, P);
// pass 2 sums the P partials of each channel in a fixed order and hands them
// to Fin: __device__ void operator()(int64_t c, double a, double b) const.
// The result depends only on the shape and the device, never on timing.

template <class I, class Op>
__global__ void channel_partials_kernel(Op op, I n, I c, I s, double* __restrict__ partials) {
  const I ch = static_cast<I>(blockIdx.x);
  const I p = static_cast<I>(blockIdx.y), np = static_cast<I>(gridDim.y);
  const I total = n * s;
  double a = 0.0, b = 0.0;
  for (I e = p * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); e < total;
       e += np * static_cast<I>(blockDim.x)) {
    const I nn = e / s;
    const I ss = e - nn * s;
    op((nn * c + ch) * s + ss, ch, a, b);
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    partials[static_cast<int64_t>(ch) * np + p] = a;
    partials[(static_cast<int64_t>(c) + ch) * np + p] = b;
  }
}

template <class Fin>
__global__ void channel_finish_kernel(Fin fin, const double* __restrict__ partials, int64_t c, int np) {
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c; ch += int64_t{gridDim.x} * blockDim.x) {
    double a = 0.0, b = 0.0;
    const double* pa = partials + ch * np;
    const double* pb = partials + (c + ch) * np;
    for (int i = 0; i < np; ++i) {
      a += pa[i];
      b += pb[i];
    }
    fin(ch, a, b);
  }
}

// Runs the two passes on the context's compute stream; scratch comes from the
// context's workspace. OpFor<I> is the element functor for index type I.
template <template <class> class OpFor, class Fin, class... Args>
void channel_reduce(Context& ctx, int64_t n, int64_t c, int64_t s, const Fin& fin, Args... args) {
  if (c == 0) return;
  FANOUT_CHECK(c <= INT32_MAX) << "channel_reduce: " << c << " channels";
  const int64_t total = n * s;
  // Partial blocks per channel: enough blocks to fill the device, but each
  // block gets at least ~4 elements per thread; at most 1024 partials.
  const int64_t want = ceil_div(int64_t{sm_count(ctx.device().index)} * 4, c);
  const int np = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, ceil_div(total, kThreads * 4), 1024})));
  auto* partials = static_cast<double*>(ctx.workspace(sizeof(double) * 2 * static_cast<size_t>(c) * np));
  cudaStream_t st = stream_of(ctx);
  const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(np));
  dispatch_index(n * c * s, [&](auto tag) {
    using I = decltype(tag);
    channel_partials_kernel<I><<<grid, kThreads, 0, st>>>(OpFor<I>{args...}, static_cast<I>(n), static_cast<I>(c),
                                                          static_cast<I>(s), partials);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
  const int fin_blocks = static_cast<int>(ceil_div(c, kThreads));
  channel_finish_kernel<<<fin_blocks, kThreads, 0, st>>>(fin, partials, c, np);
  FANOUT_CUDA_CHECK_LAUNCH();
}

// Channels-last partial sums: block p takes rows [p * per, (p + 1) * per) of
// the (rows, C) matrix, threads spread over a tile of channels and over rows
// (coalesced: a warp reads consecutive channels of a row); the rows' lanes
// are added in a fixed order in shared memory. partials (2, C, P) as
// channel_reduce's first pass writes them.
template <class I, class Op>
__global__ void channels_last_partials_kernel(Op op, I rows, I c, I per, double* __restrict__ partials) {
  __shared__ double sa[kThreads], sb[kThreads];
  const I p = static_cast<I>(blockIdx.x), np = static_cast<I>(gridDim.x);
  const I r0 = p * per, r1 = r0 + per < rows ? r0 + per : rows;
  for (I c0 = 0; c0 < c; c0 += kThreads) {
    const I tile = c - c0 < kThreads ? c - c0 : static_cast<I>(kThreads);
    const I lanes = static_cast<I>(kThreads) / tile;
    const I t = static_cast<I>(threadIdx.x), k = t % tile, lane = t / tile;
    double a = 0.0, b = 0.0;
    if (lane < lanes)
      for (I r = r0 + lane; r < r1; r += lanes) op(r * c + c0 + k, c0 + k, a, b);
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    if (t < tile) {
      double ta = 0.0, tb = 0.0;
      for (I l = 0; l < lanes; ++l) {
        ta += sa[l * tile + t];
        tb += sb[l * tile + t];
      }
      partials[static_cast<int64_t>(c0 + t) * np + p] = ta;
      partials[(static_cast<int64_t>(c) + c0 + t) * np + p] = tb;
    }
    __syncthreads();
  }
}

// channel_reduce over an (N, C, S) tensor stored NC(S) or, with `last`,
// channels-last N(S)C (op then gets element i of that order): the same
// fixed-order second pass, deterministic for a shape and device.
template <template <class> class OpFor, class Fin, class... Args>
void channel_reduce_stored(Context& ctx, int64_t n, int64_t c, int64_t s, bool last, const Fin& fin, Args... args) {
  if (!last) return channel_reduce<OpFor>(ctx, n, c, s, fin, args...);
  if (c == 0) return;
  const int64_t rows = n * s;
  const int64_t want = int64_t{sm_count(ctx.device().index)} * 4;
  // At most 64 MiB of partials (2 doubles per channel and block): a wide
  // layer (a vocabulary-sized bias) gets fewer blocks, not a huge workspace.
  const int64_t budget = std::max<int64_t>(1, (int64_t{64} << 20) / (16 * c));
  const int np =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, ceil_div(rows, 64), int64_t{1024}, budget})));
  const int64_t per = ceil_div(rows, np);
  auto* partials = static_cast<double*>(ctx.workspace(sizeof(double) * 2 * static_cast<size_t>(c) * np));
  cudaStream_t st = stream_of(ctx);
  dispatch_index(rows * c, [&](auto tag) {
    using I = decltype(tag);
    channels_last_partials_kernel<I><<<np, kThreads, 0, st>>>(OpFor<I>{args...}, static_cast<I>(rows),
                                                              static_cast<I>(c), static_cast<I>(per), partials);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
  channel_finish_kernel<<<static_cast<int>(ceil_div(c, kThreads)), kThreads, 0, st>>>(fin, partials, c, np);
  FANOUT_CUDA_CHECK_LAUNCH();
}

// (N, C, S) view of an (N, C, ...) tensor: S is the product of the trailing dims.
struct Planes {
  int64_t n, c, s;
};
inline Planes planes_of(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

// A process-wide cache of plans (cuDNN descriptors) by key, never destroyed:
// plans hold only host-side descriptors, and destroying them during static
// teardown could run after cuDNN has unloaded. A missing plan is built
// unlocked (a timed search may sync a stream, finalizing may compile
// kernels: neither may hold up other devices' workers); a racing twin keeps
// the first plan inserted.
template <class Key, class Plan>
class PlanCache {
 public:
  static PlanCache& instance() {
    static PlanCache* cache = new PlanCache;
    return *cache;
  }
  template <class Build>
  Plan& get(const Key& key, const Build& build) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return *it->second;
    }
    std::unique_ptr<Plan> plan = build();
    std::lock_guard<std::mutex> lock(mu_);
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

 private:
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// softmax_forward's kernel (softmax.cu); a row whose visible entries are all
// -inf or NaN gives NaN there with empty_nan (attention's CPU arithmetic),
// zeros without (softmax's).
void softmax_forward_rows(Context& ctx, const Tensor& x, bool causal, bool empty_nan, Tensor& y);

}  // namespace fanout::kernels::cuda::detail
