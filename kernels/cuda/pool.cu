// CUDA pooling and upsampling over (N, C, H, W) or (N, C, D, H, W), stored
// NC... or channels-last, in float32, bfloat16 or float16 (read and written
// natively, arithmetic in float32); CPU counterparts in kernels/cpu/pool.cpp. A 2-D pooling runs as a 3-D one with
// depth 1 and a window of 1 along it. Windows are clipped to the volume
// exactly as on the CPU: padding is never selected by max pooling and counts
// as zeros for average pooling (divisor kernel^rank).
#include "kernels/pool.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

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

// Where the elements of a (N, C, volume) tensor lie: NC(volume) or
// channels-last N(volume)C. vol = n * C + c names a (sample, channel) volume;
// at(vol, k, V) is element k of it, V the volume's size; volume_of(i, V)
// the (vol, k) of the element stored at i (threads over i walk memory in
// order, so neighbouring threads take neighbouring channels channels-last).
template <class I>
struct Layout {
  I c;
  bool last;
  __device__ I at(I vol, I k, I v) const { return last ? ((vol / c) * v + k) * c + vol % c : vol * v + k; }
  __device__ void volume_of(I i, I v, I& vol, I& k) const {
    if (!last) {
      vol = i / v;
      k = i - vol * v;
      return;
    }
    const I ch = i % c, t = i / c;
    k = t % v;
    vol = (t / v) * c + ch;
  }
};

// Output (vol, k)'s window clipped to the volume: [d0, d1) x [h0, h1) x
// [w0, w1), as the CPU path's each_window.
template <class I>
struct Box {
  I d0, d1, h0, h1, w0, w1;
};
template <class I>
__device__ __forceinline__ Box<I> window_of(I k, const PoolDims<I>& d) {
  const Coords<I> o = coords_of(k, d.out[0], d.out[1], d.out[2]);
  Box<I> b;
  window(d, 0, o.a, b.d0, b.d1);
  window(d, 1, o.b, b.h0, b.h1);
  window(d, 2, o.c, b.w0, b.w1);
  return b;
}

using detail::narrow;
using detail::widen;

// One thread per output. First maximum wins; NaN propagates (as the CPU path:
// a NaN replaces the running best, so the last NaN of the window is kept).
// argmax is indexed logically (vol * out volume + k) in either layout.
template <class T, class I>
__global__ void maxpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ argmax,
                                       I total, PoolDims<I> d, Layout<I> l) {
  const I h = d.len[1], w = d.len[2], iv = d.in_volume(), ov = d.out_volume();
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, ov, vol, k);
    const Box<I> bx = window_of(k, d);
    float best = -CUDART_INF_F;
    I best_i = (bx.d0 * h + bx.h0) * w + bx.w0;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b) {
        const I row = (a * h + b) * w;
        for (I c = bx.w0; c < bx.w1; ++c) {
          const float v = widen(x[l.at(vol, row + c, iv)]);
          if (v > best || isnan(v)) {
            best = v;
            best_i = row + c;
          }
        }
      }
    y[i] = narrow<T>(best);  // a value of x: exact
    argmax[vol * ov + k] = static_cast<int32_t>(best_i);
  }
}

// acc (float32, zeroed before, laid out as dx) += dy scattered through
// argmax; one thread per dy element, atomics where windows overlap.
// Out-of-volume indices (corrupt argmax; the CPU path throws) are skipped: a
// kernel cannot throw.
template <class T, class I>
__global__ void maxpool_backward_atomic_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ acc, I total, I out, I in, Layout<I> l) {
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, out, vol, k);
    const int32_t m = argmax[vol * out + k];
    if (m >= 0 && static_cast<I>(m) < in) atomicAdd(acc + l.at(vol, static_cast<I>(m), in), widen(dy[i]));
  }
}

// Deterministic variant (ctx.math.deterministic): one thread per volume adds
// its outputs in order, as the CPU path does.
template <class T, class I>
__global__ void maxpool_backward_serial_kernel(const T* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ acc, I vols, I out, I in, Layout<I> l) {
  for (I v : detail::grid_stride(vols)) {
    const int32_t* a = argmax + v * out;
    for (I k = 0; k < out; ++k) {
      const int32_t m = a[k];
      if (m >= 0 && static_cast<I>(m) < in) acc[l.at(v, static_cast<I>(m), in)] += widen(dy[l.at(v, k, out)]);
    }
  }
}

// One thread per output: the window's sum over the volume / kernel^rank, in
// (depth, row, column) order with explicit roundings, as the CPU path.
template <class T, class I>
__global__ void avgpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, I total, PoolDims<I> d,
                                       float inv, Layout<I> l) {
  const I h = d.len[1], w = d.len[2], iv = d.in_volume(), ov = d.out_volume();
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, ov, vol, k);
    const Box<I> bx = window_of(k, d);
    float s = 0.0f;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b)
        for (I c = bx.w0; c < bx.w1; ++c) s = __fadd_rn(s, widen(x[l.at(vol, (a * h + b) * w + c, iv)]));
    y[i] = narrow<T>(__fmul_rn(s, inv));
  }
}

// One thread per input element: dy / kernel^rank of the windows holding it
// (=), in (depth, row, column) order of the outputs, as the CPU path. No atomics.
template <class T, class I>
__global__ void avgpool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, I total, PoolDims<I> d,
                                        float inv, Layout<I> l) {
  const I oh = d.out[1], ow = d.out[2], iv = d.in_volume(), ov = d.out_volume();
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, iv, vol, k);
    const Coords<I> at = coords_of(k, d.len[0], d.len[1], d.len[2]);
    I i0, i1, j0, j1, k0, k1;
    covering(d, 0, at.a, i0, i1);
    covering(d, 1, at.b, j0, j1);
    covering(d, 2, at.c, k0, k1);
    float s = 0.0f;
    for (I oi = i0; oi < i1; ++oi)
      for (I oj = j0; oj < j1; ++oj)
        for (I ok = k0; ok < k1; ++ok)
          s = __fadd_rn(s, __fmul_rn(widen(dy[l.at(vol, (oi * oh + oj) * ow + ok, ov)]), inv));
    dx[i] = narrow<T>(s);
  }
}

// One warp per plane of a contiguous float32 x: y[p] = mean of the plane.
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

// Other storage: one thread per plane, its elements in order (channels-last:
// neighbouring threads read neighbouring channels).
template <class T, class I>
__global__ void global_avg_forward_plane_kernel(const T* __restrict__ x, T* __restrict__ y, I planes, I hw,
                                                float inv, Layout<I> l) {
  for (I p : detail::grid_stride(planes)) {
    float s = 0.0f;
    for (I k = 0; k < hw; ++k) s += widen(x[l.at(p, k, hw)]);
    y[p] = narrow<T>(s * inv);  // y (N, C, 1, 1): the same order in either layout
  }
}

// dx[i] = dy[plane(i)] / hw (=).
template <class T, class I>
__global__ void global_avg_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, I total, I hw, float inv,
                                           Layout<I> l) {
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, hw, vol, k);
    dx[i] = narrow<T>(widen(dy[vol]) * inv);
  }
}

// One thread per output: y[v, i, j, k] = x[v, i/s, j/s, k/s].
template <class T, class I>
__global__ void upsample3d_forward_kernel(const T* __restrict__ x, T* __restrict__ y, I total, I d, I h, I w, I s,
                                          Layout<I> l) {
  const I ow = w * s, oh = h * s, od = d * s;
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, od * oh * ow, vol, k);
    const Coords<I> o = coords_of(k, od, oh, ow);
    y[i] = x[l.at(vol, (o.a / s * h + o.b / s) * w + o.c / s, d * h * w)];
  }
}

// One thread per input element: the sum of its s^3 copies' gradients (=), in
// the order (depth, row, column), as the CPU path. Deterministic, no atomics.
template <class T, class I>
__global__ void upsample3d_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, I total, I d, I h, I w, I s,
                                           Layout<I> l) {
  const I ow = w * s, oh = h * s, ov = d * s * oh * ow;
  for (I i : detail::grid_stride(total)) {
    I vol, k;
    l.volume_of(i, d * h * w, vol, k);
    const Coords<I> at = coords_of(k, d, h, w);
    float sum = 0.0f;
    for (I a = 0; a < s; ++a)
      for (I b = 0; b < s; ++b)
        for (I c = 0; c < s; ++c)
          sum += widen(dy[l.at(vol, ((at.a * s + a) * oh + at.b * s + b) * ow + at.c * s + c, ov)]);
    dx[i] = narrow<T>(sum);
  }
}

// launch(T{}, I{}, layout, blocks, stream) over `total` threads' worth of
// elements of tensors stored as t: its element type and layout.
template <class Launch>
void launch_stored(Context& ctx, const Tensor& t, int64_t total, int64_t extent, Launch&& launch) {
  detail::with_storage(t.dtype(), [&](auto tag_t) {
    detail::launch_per_element(ctx, total, extent, [&](auto tag_i, int blocks, cudaStream_t st) {
      using I = decltype(tag_i);
      launch(tag_t, tag_i, Layout<I>{static_cast<I>(t.size(1)), t.channels_last()}, blocks, st);
    });
  });
}

}  // namespace

// Every entry point takes its activations in any floating storage and either
// format, all alike (kernels/pool.cpp checks).

void maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y,
                     Tensor& argmax) {
  const PoolAxes axes = pool_axes(spatial, x.shape(), y.shape(), g);
  launch_stored(ctx, x, y.numel(), x.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    maxpool_forward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(
        x.data<T>(), y.data<T>(), argmax.data<int32_t>(), static_cast<I>(y.numel()), pool_dims<I>(axes), l);
  });
}

void maxpool_backward(Context& ctx, int, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  if (dx.numel() == 0) return;
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  // Gradients add in float32 (into dx, or into scratch laid out as dx and
  // rounded into it once after: overlapping windows round once, as the CPU).
  const bool wide = dx.dtype() == DType::F32;
  float* acc = wide ? dx.f32() : static_cast<float*>(ctx.workspace(static_cast<size_t>(dx.numel()) * sizeof(float)));
  FANOUT_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<size_t>(dx.numel()) * sizeof(float), st));
  const int64_t total = dy.numel();
  if (total > 0) {
    const int64_t vols = dy.size(0) * dy.size(1), out = total / vols, in = dx.numel() / vols;
    detail::with_storage(dy.dtype(), [&](auto tag_t) {
      using T = decltype(tag_t);
      detail::dispatch_index(std::max(dx.numel(), total), [&](auto tag) {
        using I = decltype(tag);
        const Layout<I> l{static_cast<I>(dx.size(1)), dx.channels_last()};
        if (ctx.math.deterministic) {
          maxpool_backward_serial_kernel<T, I><<<detail::grid_for(ctx, vols, 128), 128, 0, st>>>(
              dy.data<T>(), argmax.data<int32_t>(), acc, static_cast<I>(vols), static_cast<I>(out),
              static_cast<I>(in), l);
        } else {
          maxpool_backward_atomic_kernel<T, I><<<detail::grid_for(ctx, total), detail::kThreads, 0, st>>>(
              dy.data<T>(), argmax.data<int32_t>(), acc, static_cast<I>(total), static_cast<I>(out),
              static_cast<I>(in), l);
        }
        FANOUT_CUDA_CHECK_LAUNCH();
      });
    });
  }
  if (!wide) detail::narrow_into(ctx, acc, dx, dx.numel());
}

void avgpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const PoolAxes axes = pool_axes(spatial, x.shape(), y.shape(), g);
  const float inv = 1.0f / static_cast<float>(axes.window_elements());
  launch_stored(ctx, x, y.numel(), x.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    avgpool_forward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(x.data<T>(), y.data<T>(),
                                                                    static_cast<I>(y.numel()), pool_dims<I>(axes),
                                                                    inv, l);
  });
}

void avgpool_backward(Context& ctx, int spatial, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const PoolAxes axes = pool_axes(spatial, dx.shape(), dy.shape(), g);
  const float inv = 1.0f / static_cast<float>(axes.window_elements());
  launch_stored(ctx, dx, dx.numel(), dy.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    avgpool_backward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(dy.data<T>(), dx.data<T>(),
                                                                     static_cast<I>(dx.numel()), pool_dims<I>(axes),
                                                                     inv, l);
  });
}

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  if (planes == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(hw);
  if (x.dtype() == DType::F32 && !x.channels_last()) {
    global_avg_forward_kernel<<<detail::grid_for(ctx, planes * 32), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), planes, hw, inv);
    FANOUT_CUDA_CHECK_LAUNCH();
    return;
  }
  launch_stored(ctx, x, planes, x.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    global_avg_forward_plane_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(
        x.data<T>(), y.data<T>(), static_cast<I>(planes), static_cast<I>(hw), inv, l);
  });
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const int64_t hw = dx.size(2) * dx.size(3);
  launch_stored(ctx, dx, dx.numel(), dx.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    global_avg_backward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(
        dy.data<T>(), dx.data<T>(), static_cast<I>(dx.numel()), static_cast<I>(hw), 1.0f / static_cast<float>(hw),
        l);
  });
}

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  const Shape& v = x.shape();
  launch_stored(ctx, x, y.numel(), y.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    upsample3d_forward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(
        x.data<T>(), y.data<T>(), static_cast<I>(y.numel()), static_cast<I>(v[2]), static_cast<I>(v[3]),
        static_cast<I>(v[4]), static_cast<I>(scale), l);
  });
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  const Shape& v = dx.shape();
  launch_stored(ctx, dx, dx.numel(), dy.numel(), [&](auto t, auto i, auto l, int grid, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(i);
    upsample3d_backward_kernel<T, I><<<grid, detail::kThreads, 0, st>>>(
        dy.data<T>(), dx.data<T>(), static_cast<I>(dx.numel()), static_cast<I>(v[2]), static_cast<I>(v[3]),
        static_cast<I>(v[4]), static_cast<I>(scale), l);
  });
}

}  // namespace fanout::kernels::cuda
