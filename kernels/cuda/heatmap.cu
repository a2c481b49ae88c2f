// CUDA heatmaps: one launch draws every landmark of the batch and writes the
// whole output, zeros included (no memset, no atomics on the output).
//
// A block owns a tile of kTile consecutive voxels of one (sample, channel)
// plane. It gathers into shared memory the landmarks of that sample mapped to
// its channel whose clipped window may reach the tile (in chunks of kThreads
// landmarks; with channel indices every block scans all K of its sample),
// then each thread takes the maximum over them for its kItems voxels,
// starting from 0, and stores it. Values are >= 0 and never NaN, so the
// maximum does not depend on the order the landmarks were gathered in.
//
// Same bits as the CPU renderer (kernels/cpu/heatmap.cpp):
// - the factor table is heatmap_axis_factors, computed on the host with the
//   same double exp and rounding to float as the CPU; it travels in the
//   launch parameters up to radius kParamFactors - 1, beyond that in device
//   memory (a host-to-device copy, complete before the launch);
// - a landmark's voxel is floor(double(coord) + 0.5) per axis and the test
//   for its window missing the volume is the CPU's, in double;
// - a voxel's value is (f[|dz|] * f[|dy|]) * f[|dx|] with __fmul_rn (no FMA
//   contraction), f[0] = 1 for z in 2D, set to 0 below FLT_EPSILON.
// Coordinates and channels are not checked here (that would read device
// memory on the host): a non-finite coordinate fails the window test and a
// channel outside [0, C) matches no plane, so such a landmark draws nothing.
#include "kernels/heatmap.h"

#include <cfloat>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

using detail::kThreads;
constexpr int kItems = 4;                   // voxels per thread
constexpr int kTile = kThreads * kItems;    // voxels per block
constexpr int kParamFactors = 512;          // tables up to this size travel in the launch parameters (2 KiB)

struct ParamFactors {
  float f[kParamFactors];
};

template <class I>
struct Geometry {
  const float* coords;     // (N, K, S)
  const int32_t* channel;  // (K), or null: landmark k into channel k
  const float* factors;    // (r + 1) in device memory, or null: the table is in ParamFactors
  float* out;              // (N, C, D, H, W), D = 1 in 2D
  int64_t k, c;            // landmarks and channels per sample
  int64_t tiles;           // tiles per plane
  I vol[3];                // D, H, W
  I voxels;                // D * H * W
  I r;
  int s;                   // coordinates per landmark, 2 or 3
};

template <class I>
__device__ __forceinline__ void unflatten(I v, const I vol[3], I& z, I& y, I& x) {
  x = v % vol[2];
  const I t = v / vol[2];
  y = t % vol[1];
  z = t / vol[1];
}

template <class I>
__device__ __forceinline__ I iabs(I d) {
  return d < 0 ? -d : d;
}

// The landmark's voxel c (z, y, x; z = 0 in 2D), false when its window misses
// the volume (tested in double, as the CPU does: the center may be far
// outside I's range, or NaN).
template <class I>
__device__ bool landmark_center(const float* p, const Geometry<I>& g, I c[3]) {
  for (int a = 0; a < 3; ++a) {
    const int i = a - (3 - g.s);
    const double cd = i < 0 ? 0.0 : floor(static_cast<double>(p[i]) + 0.5);
    const double r = static_cast<double>(g.r);
    if (!(cd + r >= 0 && cd - r <= static_cast<double>(g.vol[a] - 1))) return false;
    c[a] = static_cast<I>(cd);
  }
  return true;
}

// False only when the window around c (clipped to the volume) holds none of
// the voxels [first, last] of the tile, whose coordinates are t0 and t1.
template <class I>
__device__ bool window_may_reach(const I c[3], const Geometry<I>& g, const I t0[3], const I t1[3]) {
  for (int a = 0; a < 3; ++a) {
    const I lo = c[a] - g.r > 0 ? c[a] - g.r : I(0);
    const I hi = c[a] + g.r < g.vol[a] - 1 ? c[a] + g.r : g.vol[a] - 1;
    if (hi < t0[a] || lo > t1[a]) return false;
    // Along axis a the tile's voxels run monotonically only while the axes
    // before it are constant.
    if (t0[a] != t1[a]) return true;
  }
  return true;
}

template <class I>
__global__ void __launch_bounds__(kThreads) heatmap_kernel(Geometry<I> g, ParamFactors pf) {
  __shared__ float s_factors[kParamFactors];
  __shared__ I s_center[3][kThreads];
  __shared__ int s_count;

  const int64_t plane = static_cast<int64_t>(blockIdx.x) / g.tiles;  // n * C + channel
  const I first = static_cast<I>(static_cast<int64_t>(blockIdx.x) - plane * g.tiles) * I(kTile);
  const I end = first + I(kTile) < g.voxels ? first + I(kTile) : g.voxels;
  const int64_t n = plane / g.c, ch = plane - n * g.c;

  const float* f = g.factors;
  if (!f) {
    for (I i = static_cast<I>(threadIdx.x); i <= g.r; i += I(kThreads)) s_factors[i] = pf.f[i];
    f = s_factors;  // read only after the __syncthreads below
  }

  I t0[3], t1[3];
  unflatten(first, g.vol, t0[0], t0[1], t0[2]);
  unflatten(end - 1, g.vol, t1[0], t1[1], t1[2]);

  I vz[kItems], vy[kItems], vx[kItems];
  float acc[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    unflatten(first + static_cast<I>(threadIdx.x) + I(j * kThreads), g.vol, vz[j], vy[j], vx[j]);
    acc[j] = 0.0f;
  }

  // Without channel indices only landmark `ch` draws into this plane.
  const float* coords = g.coords + n * g.k * g.s;
  const int64_t l_begin = g.channel ? 0 : ch, l_end = g.channel ? g.k : ch + 1;
  for (int64_t base = l_begin; base < l_end; base += kThreads) {
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    const int64_t l = base + threadIdx.x;
    if (l < l_end && (!g.channel || static_cast<int64_t>(g.channel[l]) == ch)) {
      I c[3];
      if (landmark_center(coords + l * g.s, g, c) && window_may_reach(c, g, t0, t1)) {
        const int slot = atomicAdd(&s_count, 1);
        for (int a = 0; a < 3; ++a) s_center[a][slot] = c[a];
      }
    }
    __syncthreads();
    const int m = s_count;
    for (int i = 0; i < m; ++i) {
      const I cz = s_center[0][i], cy = s_center[1][i], cx = s_center[2][i];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const I dz = iabs(vz[j] - cz), dy = iabs(vy[j] - cy), dx = iabs(vx[j] - cx);
        if (dz > g.r || dy > g.r || dx > g.r) continue;
        const float v = __fmul_rn(__fmul_rn(f[dz], f[dy]), f[dx]);
        const float gv = v < FLT_EPSILON ? 0.0f : v;
        acc[j] = acc[j] < gv ? gv : acc[j];
      }
    }
    __syncthreads();  // s_center and s_count are rewritten by the next chunk
  }

  float* o = g.out + plane * static_cast<int64_t>(g.voxels);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const I v = first + static_cast<I>(threadIdx.x) + I(j * kThreads);
    if (v < end) o[v] = acc[j];
  }
}

}  // namespace

void render_heatmaps(Context& ctx, const Tensor& landmarks, const HeatmapParams& p, Tensor& out,
                     const Tensor* channels) {
  if (out.numel() == 0) return;
  const int s = out.dim() - 2;
  int64_t vol[3] = {1, 1, 1};
  for (int a = 0; a < s; ++a) vol[3 - s + a] = out.size(2 + a);
  const int64_t voxels = vol[0] * vol[1] * vol[2];
  const int64_t planes = out.size(0) * out.size(1);
  const int64_t tiles = detail::ceil_div(voxels, kTile);
  FANOUT_CHECK(planes <= int64_t{INT32_MAX} / tiles)
      << "render_heatmaps: out " << out.shape().str() << " needs more than 2^31 - 1 blocks";

  detail::DeviceScope scope(ctx);
  const std::vector<float> table = heatmap_axis_factors(p);
  ParamFactors pf;
  Tensor factors;  // the table in device memory when it is too large for the parameters
  if (table.size() <= static_cast<size_t>(kParamFactors)) {
    std::memcpy(pf.f, table.data(), table.size() * sizeof(float));
  } else {
    std::memset(pf.f, 0, sizeof(pf.f));
    Tensor host = Tensor::empty(Shape{static_cast<int64_t>(table.size())});
    std::memcpy(host.raw(), table.data(), table.size() * sizeof(float));
    // Complete on return (no stream given), so `host` may go; the device copy
    // is freed only after the kernel has run (frees are stream-ordered).
    factors = host.to(ctx.device());
  }

  // Offsets from a center reach max(vol) - 1 + r; plane voxel indices reach voxels + kTile.
  const int64_t extent = std::max(voxels + kTile, std::max({vol[0], vol[1], vol[2]}) + 2 * int64_t{p.radius});
  detail::dispatch_index(extent, [&](auto tag) {
    using I = decltype(tag);
    Geometry<I> g;
    g.coords = landmarks.f32();
    g.channel = channels ? channels->data<int32_t>() : nullptr;
    g.factors = factors.defined() ? factors.f32() : nullptr;
    g.out = out.f32();
    g.k = landmarks.size(1);
    g.c = out.size(1);
    g.tiles = tiles;
    for (int a = 0; a < 3; ++a) g.vol[a] = static_cast<I>(vol[a]);
    g.voxels = static_cast<I>(voxels);
    g.r = static_cast<I>(p.radius);
    g.s = s;
    heatmap_kernel<I><<<static_cast<unsigned>(planes * tiles), kThreads, 0, detail::stream_of(ctx)>>>(g, pf);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
