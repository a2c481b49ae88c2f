// CUDA pooling and upsampling over (N, C, H, W) or (N, C, D, H, W); CPU
// counterparts in kernels/cpu/pool.cpp. A 2-D pooling runs as a 3-D one with
// depth 1 and a window of 1 along it. Windows are clipped to the volume
// exactly as on the CPU: padding is never selected by max pooling and counts
// as zeros for average pooling (divisor kernel^rank).
#include "kernels/pool.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

// PoolAxes (kernels/pool.h) in the kernel's index type.
template <class I>
struct PoolDims {
  I len[3], out[3], k[3], stride[3], pad[3];
  __host__ __device__ I in_volume() const { return len[0] * len[1] * len[2]; }
  __host__ __device__ I out_volume() const { return out[0] * out[1] * out[2]; }
};

template <class I>
PoolDims<I> pool_dims(const PoolAxes& a) {
  PoolDims<I> d;
  for (int i = 0; i < 3; ++i) {
    d.len[i] = static_cast<I>(a.len[i]);
    d.out[i] = static_cast<I>(a.out[i]);
    d.k[i] = static_cast<I>(a.g[i].kernel);
    d.stride[i] = static_cast<I>(a.g[i].stride);
    d.pad[i] = static_cast<I>(a.g[i].padding);
  }
  return d;
}

// Window [lo, hi) of output index o along axis a, clipped to the axis.
template <class I>
__device__ __forceinline__ void window(const PoolDims<I>& d, int a, I o, I& lo, I& hi) {
  const I start = o * d.stride[a] - d.pad[a];
  lo = start > 0 ? start : I(0);
  hi = start + d.k[a] < d.len[a] ? start + d.k[a] : d.len[a];
}

// Outputs [lo, hi) along axis a whose windows hold input index i.
template <class I>
__device__ __forceinline__ void covering(const PoolDims<I>& d, int a, I i, I& lo, I& hi) {
  const I p = i + d.pad[a];
  lo = p >= d.k[a] ? (p - d.k[a]) / d.stride[a] + 1 : I(0);
  hi = p / d.stride[a] + 1 < d.out[a] ? p / d.stride[a] + 1 : d.out[a];
}

// Flat index i of a (volumes, d, h, w) layout as (volume, depth, row, column).
template <class I>
struct Coords {
  I vol, a, b, c;
};
template <class I>
__device__ __forceinline__ Coords<I> coords_of(I i, I d, I h, I w) {
  Coords<I> r;
  r.c = i % w;
  I t = i / w;
  r.b = t % h;
  t /= h;
  r.a = t % d;
  r.vol = t / d;
  return r;
}

// Output i's (sample, channel) volume and its window clipped to the volume:
// [d0, d1) x [h0, h1) x [w0, w1), as the CPU path's each_window.
template <class I>
struct Box {
  I vol, d0, d1, h0, h1, w0, w1;
};
template <class I>
__device__ __forceinline__ Box<I> window_of(I i, const PoolDims<I>& d) {
  const Coords<I> o = coords_of(i, d.out[0], d.out[1], d.out[2]);
  Box<I> b;
  b.vol = o.vol;
  window(d, 0, o.a, b.d0, b.d1);
  window(d, 1, o.b, b.h0, b.h1);
  window(d, 2, o.c, b.w0, b.w1);
  return b;
}

// One thread per output. First maximum wins; NaN propagates (as the CPU path:
// a NaN replaces the running best, so the last NaN of the window is kept).
template <class I>
__global__ void maxpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       int32_t* __restrict__ argmax, I total, PoolDims<I> d) {
  const I h = d.len[1], w = d.len[2];
  for (I i : detail::grid_stride(total)) {
    const Box<I> bx = window_of(i, d);
    const float* xs = x + bx.vol * d.in_volume();
    float best = -CUDART_INF_F;
    I best_i = (bx.d0 * h + bx.h0) * w + bx.w0;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b) {
        const I row = (a * h + b) * w;
        for (I c = bx.w0; c < bx.w1; ++c) {
          const float v = xs[row + c];
          if (v > best || isnan(v)) {
            best = v;
            best_i = row + c;
          }
        }
      }
    y[i] = best;
    argmax[i] = static_cast<int32_t>(best_i);
  }
}

// dx (zeroed before) += dy scattered through argmax; one thread per dy
// element, atomics where windows overlap. Out-of-volume indices (corrupt
// argmax; the CPU path throws) are skipped: a kernel cannot throw.
template <class I>
__global__ void maxpool_backward_atomic_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ dx, I total, I out, I in) {
  for (I i : detail::grid_stride(total)) {
    const I vol = i / out;
    const int32_t k = argmax[i];
    if (k >= 0 && static_cast<I>(k) < in) atomicAdd(dx + vol * in + k, dy[i]);
  }
}

// Deterministic variant (ctx.math.deterministic): one thread per volume adds
// its outputs in order, as the CPU path does.
template <class I>
__global__ void maxpool_backward_serial_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ dx, I vols, I out, I in) {
  for (I v : detail::grid_stride(vols)) {
    const float* g = dy + v * out;
    const int32_t* a = argmax + v * out;
    float* dv = dx + v * in;
    for (I i = 0; i < out; ++i) {
      const int32_t k = a[i];
      if (k >= 0 && static_cast<I>(k) < in) dv[k] += g[i];
    }
  }
}

// One thread per output: the window's sum over the volume / kernel^rank, in
// (depth, row, column) order with explicit roundings, as the CPU path.
template <class I>
__global__ void avgpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, I total, PoolDims<I> d,
                                       float inv) {
  const I h = d.len[1], w = d.len[2];
  for (I i : detail::grid_stride(total)) {
    const Box<I> bx = window_of(i, d);
    const float* xs = x + bx.vol * d.in_volume();
    float s = 0.0f;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b)
        for (I c = bx.w0; c < bx.w1; ++c) s = __fadd_rn(s, xs[(a * h + b) * w + c]);
    y[i] = __fmul_rn(s, inv);
  }
}

// One thread per input element: dy / kernel^rank of the windows holding it
// (=), in (depth, row, column) order of the outputs, as the CPU path. No atomics.
template <class I>
__global__ void avgpool_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total, PoolDims<I> d,
                                        float inv) {
  const I oh = d.out[1], ow = d.out[2];
  for (I i : detail::grid_stride(total)) {
    const Coords<I> at = coords_of(i, d.len[0], d.len[1], d.len[2]);
    I i0, i1, j0, j1, k0, k1;
    covering(d, 0, at.a, i0, i1);
    covering(d, 1, at.b, j0, j1);
    covering(d, 2, at.c, k0, k1);
    const float* g = dy + at.vol * d.out_volume();
    float s = 0.0f;
    for (I oi = i0; oi < i1; ++oi)
      for (I oj = j0; oj < j1; ++oj)
        for (I ok = k0; ok < k1; ++ok) s = __fadd_rn(s, __fmul_rn(g[(oi * oh + oj) * ow + ok], inv));
    dx[i] = s;
  }
}

// One warp per plane: y[p] = mean of the plane.
__global__ void global_avg_forward_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t planes,
                                          int64_t hw, float inv) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * blockDim.x) >> 5;
  for (int64_t p = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5; p < planes; p += warps) {
    const float* xs = x + p * hw;
    float s = 0.0f;
    for (int64_t i = lane; i < hw; i += 32) s += xs[i];
    s = detail::warp_sum(s);
    if (lane == 0) y[p] = s * inv;
  }
}

// dx[i] = dy[plane(i)] / hw (=).
template <class I>
__global__ void global_avg_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total, I hw,
                                           float inv) {
  for (I i : detail::grid_stride(total))
    dx[i] = dy[i / hw] * inv;
}

// One thread per output: y[v, i, j, k] = x[v, i/s, j/s, k/s].
template <class I>
__global__ void upsample3d_forward_kernel(const float* __restrict__ x, float* __restrict__ y, I total, I d, I h, I w,
                                          I s) {
  const I ow = w * s, oh = h * s, od = d * s;
  for (I i : detail::grid_stride(total)) {
    const Coords<I> o = coords_of(i, od, oh, ow);
    y[i] = x[((o.vol * d + o.a / s) * h + o.b / s) * w + o.c / s];
  }
}

// One thread per input element: the sum of its s^3 copies' gradients (=), in
// the order (depth, row, column), as the CPU path. Deterministic, no atomics.
template <class I>
__global__ void upsample3d_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total, I d, I h,
                                           I w, I s) {
  const I ow = w * s, oh = h * s;
  for (I i : detail::grid_stride(total)) {
    const Coords<I> at = coords_of(i, d, h, w);
    const float* g = dy + at.vol * d * s * oh * ow;
    float sum = 0.0f;
    for (I a = 0; a < s; ++a)
      for (I b = 0; b < s; ++b) {
        const float* row = g + ((at.a * s + a) * oh + at.b * s + b) * ow + at.c * s;
        for (I c = 0; c < s; ++c) sum += row[c];
      }
    dx[i] = sum;
  }
}

}  // namespace

void maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y,
                     Tensor& argmax) {
  const PoolAxes axes = pool_axes(spatial, x.shape(), y.shape(), g);
  detail::launch_per_element(ctx, y.numel(), x.numel(), [&](auto tag, int grid, cudaStream_t st) {
    using I = decltype(tag);
    maxpool_forward_kernel<I><<<grid, detail::kThreads, 0, st>>>(x.f32(), y.f32(), argmax.data<int32_t>(),
                                                                 static_cast<I>(y.numel()), pool_dims<I>(axes));
  });
}

void maxpool_backward(Context& ctx, int, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  if (dx.numel() == 0) return;
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  FANOUT_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), st));
  const int64_t total = dy.numel();
  if (total == 0) return;
  const int64_t vols = dy.size(0) * dy.size(1), out = total / vols, in = dx.numel() / vols;
  detail::dispatch_index(std::max(dx.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    if (ctx.math.deterministic) {
      maxpool_backward_serial_kernel<I><<<detail::grid_for(ctx, vols, 128), 128, 0, st>>>(
          dy.f32(), argmax.data<int32_t>(), dx.f32(), static_cast<I>(vols), static_cast<I>(out), static_cast<I>(in));
    } else {
      maxpool_backward_atomic_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, st>>>(
          dy.f32(), argmax.data<int32_t>(), dx.f32(), static_cast<I>(total), static_cast<I>(out), static_cast<I>(in));
    }
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

namespace {
// Average pooling's passes, one thread per element of dst: kernel_of(I{})
// takes (src, dst, total, dims, 1 / kernel^rank).
template <class KernelOf>
void launch_avg(Context& ctx, const PoolAxes& axes, const Tensor& src, Tensor& dst, KernelOf kernel_of) {
  detail::launch_per_element(ctx, dst.numel(), src.numel(), [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    kernel_of(tag)<<<blocks, detail::kThreads, 0, st>>>(src.f32(), dst.f32(), static_cast<I>(dst.numel()),
                                                        pool_dims<I>(axes),
                                                        1.0f / static_cast<float>(axes.window_elements()));
  });
}
}  // namespace

void avgpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  launch_avg(ctx, pool_axes(spatial, x.shape(), y.shape(), g), x, y,
             [](auto tag) { return &avgpool_forward_kernel<decltype(tag)>; });
}

void avgpool_backward(Context& ctx, int spatial, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  launch_avg(ctx, pool_axes(spatial, dx.shape(), dy.shape(), g), dy, dx,
             [](auto tag) { return &avgpool_backward_kernel<decltype(tag)>; });
}

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  if (planes == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(hw);
  global_avg_forward_kernel<<<detail::grid_for(ctx, planes * 32), detail::kThreads, 0, detail::stream_of(ctx)>>>(
      x.f32(), y.f32(), planes, hw, inv);
  FANOUT_CUDA_CHECK_LAUNCH();
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const int64_t hw = dx.size(2) * dx.size(3);
  detail::launch_per_element(ctx, dx.numel(), dx.numel(), [&](auto tag, int grid, cudaStream_t st) {
    using I = decltype(tag);
    global_avg_backward_kernel<I><<<grid, detail::kThreads, 0, st>>>(
        dy.f32(), dx.f32(), static_cast<I>(dx.numel()), static_cast<I>(hw), 1.0f / static_cast<float>(hw));
  });
}

namespace {
// Nearest upsampling's passes, one thread per element of dst: kernel_of(I{})
// takes (src, dst, total, D, H, W of the small volume vol, scale).
template <class KernelOf>
void launch_upsample(Context& ctx, int64_t scale, const Tensor& src, Tensor& dst, const Shape& vol,
                     KernelOf kernel_of) {
  detail::launch_per_element(ctx, dst.numel(), src.numel(), [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    kernel_of(tag)<<<blocks, detail::kThreads, 0, st>>>(src.f32(), dst.f32(), static_cast<I>(dst.numel()),
                                                        static_cast<I>(vol[2]), static_cast<I>(vol[3]),
                                                        static_cast<I>(vol[4]), static_cast<I>(scale));
  });
}
}  // namespace

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  launch_upsample(ctx, scale, x, y, x.shape(), [](auto tag) { return &upsample3d_forward_kernel<decltype(tag)>; });
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  launch_upsample(ctx, scale, dy, dx, dx.shape(),
                  [](auto tag) { return &upsample3d_backward_kernel<decltype(tag)>; });
}

}  // namespace fanout::kernels::cuda
