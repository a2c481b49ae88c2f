// CUDA volumetric max pooling (with argmax) and nearest upsampling over
// (N, C, D, H, W); CPU counterparts in kernels/cpu/pool3d.cpp. Windows are
// clipped to the volume exactly as on the CPU: padding is never selected.
#include "kernels/pool3d.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

template <class I>
struct Pool3dDims {
  I d, h, w, od, oh, ow, k, stride, pad;
};

template <class I>
Pool3dDims<I> pool_dims(const Shape& x, const Shape& y, const PoolGeometry& g) {
  return {static_cast<I>(x[2]),     static_cast<I>(x[3]),      static_cast<I>(x[4]),
          static_cast<I>(y[2]),     static_cast<I>(y[3]),      static_cast<I>(y[4]),
          static_cast<I>(g.kernel), static_cast<I>(g.stride), static_cast<I>(g.padding)};
}

// Window [lo, hi) of output index o along an axis of length len.
template <class I>
__device__ __forceinline__ void window(I o, I k, I stride, I pad, I len, I& lo, I& hi) {
  const I start = o * stride - pad;
  lo = start > 0 ? start : I(0);
  hi = start + k < len ? start + k : len;
}

// Output i's (sample, channel) volume and its window clipped to the volume:
// [d0, d1) x [h0, h1) x [w0, w1), as the CPU path's each_window.
template <class I>
struct Box {
  I vol, d0, d1, h0, h1, w0, w1;
};
template <class I>
__device__ __forceinline__ Box<I> window_of(I i, const Pool3dDims<I>& d) {
  const I ok = i % d.ow;
  I t = i / d.ow;
  const I oj = t % d.oh;
  t /= d.oh;
  Box<I> b;
  b.vol = t / d.od;
  window(t % d.od, d.k, d.stride, d.pad, d.d, b.d0, b.d1);
  window(oj, d.k, d.stride, d.pad, d.h, b.h0, b.h1);
  window(ok, d.k, d.stride, d.pad, d.w, b.w0, b.w1);
  return b;
}

// One thread per output. First maximum wins; NaN propagates (as the CPU path:
// a NaN replaces the running best, so the last NaN of the window is kept).
template <class I>
__global__ void maxpool3d_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                         int32_t* __restrict__ argmax, I total, Pool3dDims<I> d) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const Box<I> bx = window_of(i, d);
    const float* xs = x + bx.vol * d.d * d.h * d.w;
    float best = -CUDART_INF_F;
    I best_i = (bx.d0 * d.h + bx.h0) * d.w + bx.w0;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b) {
        const I row = (a * d.h + b) * d.w;
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

// One thread per output: y[v, i, j, k] = x[v, i/s, j/s, k/s].
template <class I>
__global__ void upsample3d_forward_kernel(const float* __restrict__ x, float* __restrict__ y, I total, I d, I h, I w,
                                          I s) {
  const I ow = w * s, oh = h * s, od = d * s;
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I k = i % ow;
    I t = i / ow;
    const I j = t % oh;
    t /= oh;
    const I a = t % od, vol = t / od;
    y[i] = x[((vol * d + a / s) * h + j / s) * w + k / s];
  }
}

// One thread per output: the window's sum over the volume / kernel^3, in
// (depth, row, column) order with explicit roundings, as the CPU path.
template <class I>
__global__ void avgpool3d_forward_kernel(const float* __restrict__ x, float* __restrict__ y, I total, Pool3dDims<I> d,
                                         float inv) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const Box<I> bx = window_of(i, d);
    const float* xs = x + bx.vol * d.d * d.h * d.w;
    float s = 0.0f;
    for (I a = bx.d0; a < bx.d1; ++a)
      for (I b = bx.h0; b < bx.h1; ++b)
        for (I c = bx.w0; c < bx.w1; ++c) s = __fadd_rn(s, xs[(a * d.h + b) * d.w + c]);
    y[i] = __fmul_rn(s, inv);
  }
}

// Outputs [lo, hi) along an axis whose windows hold input index i.
template <class I>
__device__ __forceinline__ void covering(I i, I k, I stride, I pad, I out, I& lo, I& hi) {
  const I p = i + pad;
  lo = p >= k ? (p - k) / stride + 1 : I(0);
  hi = p / stride + 1 < out ? p / stride + 1 : out;
}

// One thread per input element: dy / kernel^3 of the windows holding it (=),
// in (depth, row, column) order of the outputs, as the CPU path. No atomics.
template <class I>
__global__ void avgpool3d_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total,
                                          Pool3dDims<I> d, float inv) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I c = i % d.w;
    I t = i / d.w;
    const I b = t % d.h;
    t /= d.h;
    const I a = t % d.d, vol = t / d.d;
    I i0, i1, j0, j1, k0, k1;
    covering(a, d.k, d.stride, d.pad, d.od, i0, i1);
    covering(b, d.k, d.stride, d.pad, d.oh, j0, j1);
    covering(c, d.k, d.stride, d.pad, d.ow, k0, k1);
    const float* g = dy + vol * d.od * d.oh * d.ow;
    float s = 0.0f;
    for (I oi = i0; oi < i1; ++oi)
      for (I oj = j0; oj < j1; ++oj)
        for (I ok = k0; ok < k1; ++ok) s = __fadd_rn(s, __fmul_rn(g[(oi * d.oh + oj) * d.ow + ok], inv));
    dx[i] = s;
  }
}

// One thread per input element: the sum of its s^3 copies' gradients (=), in
// the order (depth, row, column), as the CPU path. Deterministic, no atomics.
template <class I>
__global__ void upsample3d_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total, I d, I h,
                                           I w, I s) {
  const I ow = w * s, oh = h * s;
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I k = i % w;
    I t = i / w;
    const I j = t % h;
    t /= h;
    const I a0 = t % d, vol = t / d;
    const float* g = dy + vol * d * s * oh * ow;
    float sum = 0.0f;
    for (I a = 0; a < s; ++a)
      for (I b = 0; b < s; ++b) {
        const float* row = g + ((a0 * s + a) * oh + j * s + b) * ow + k * s;
        for (I c = 0; c < s; ++c) sum += row[c];
      }
    dx[i] = sum;
  }
}

}  // namespace

void maxpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const int64_t total = y.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(std::max(x.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    maxpool3d_forward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), argmax.data<int32_t>(), static_cast<I>(total), pool_dims<I>(x.shape(), y.shape(), g));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void avgpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const int64_t total = y.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel * g.kernel);
  detail::dispatch_index(std::max(x.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    avgpool3d_forward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), static_cast<I>(total), pool_dims<I>(x.shape(), y.shape(), g), inv);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void avgpool3d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel * g.kernel);
  detail::dispatch_index(std::max(dy.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    avgpool3d_backward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        dy.f32(), dx.f32(), static_cast<I>(total), pool_dims<I>(dx.shape(), dy.shape(), g), inv);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  const int64_t total = y.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(total, [&](auto tag) {
    using I = decltype(tag);
    upsample3d_forward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), static_cast<I>(total), static_cast<I>(x.size(2)), static_cast<I>(x.size(3)),
        static_cast<I>(x.size(4)), static_cast<I>(scale));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(dy.numel(), [&](auto tag) {
    using I = decltype(tag);
    upsample3d_backward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        dy.f32(), dx.f32(), static_cast<I>(total), static_cast<I>(dx.size(2)), static_cast<I>(dx.size(3)),
        static_cast<I>(dx.size(4)), static_cast<I>(scale));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
