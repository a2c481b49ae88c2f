// CUDA pooling over (N, C, H, W): max (with argmax), average
// (count_include_pad, floor mode) and global average; CPU counterparts in
// kernels/cpu/pool.cpp. Windows are clipped to the image exactly as on the
// CPU: padding is never selected by max pooling and counts as zeros for
// average pooling (divisor kernel^2).
#include "kernels/pool.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

template <class I>
struct PoolDims {
  I h, w, oh, ow, k, stride, pad;
};

template <class I>
PoolDims<I> pool_dims(const Shape& x, const Shape& y, const PoolGeometry& g) {
  return {static_cast<I>(x[2]), static_cast<I>(x[3]), static_cast<I>(y[2]), static_cast<I>(y[3]),
          static_cast<I>(g.kernel), static_cast<I>(g.stride), static_cast<I>(g.padding)};
}

// Window [lo, hi) of output index o along an axis of length len.
template <class I>
__device__ __forceinline__ void window(I o, I k, I stride, I pad, I len, I& lo, I& hi) {
  const I start = o * stride - pad;
  lo = start > 0 ? start : I(0);
  hi = start + k < len ? start + k : len;
}

// One thread per output. First maximum wins; NaN propagates (as the CPU path:
// a NaN replaces the running best, so the last NaN of the window is kept).
template <class I>
__global__ void maxpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y,
                                       int32_t* __restrict__ argmax, I total, PoolDims<I> d) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I oj = i % d.ow, t = i / d.ow;
    const I oi = t % d.oh, plane = t / d.oh;
    I h0, h1, w0, w1;
    window(oi, d.k, d.stride, d.pad, d.h, h0, h1);
    window(oj, d.k, d.stride, d.pad, d.w, w0, w1);
    const float* xs = x + plane * d.h * d.w;
    float best = -CUDART_INF_F;
    I best_i = h0 * d.w + w0;
    for (I r = h0; r < h1; ++r) {
      for (I c = w0; c < w1; ++c) {
        const float v = xs[r * d.w + c];
        if (v > best || isnan(v)) {
          best = v;
          best_i = r * d.w + c;
        }
      }
    }
    y[i] = best;
    argmax[i] = static_cast<int32_t>(best_i);
  }
}

// dx (zeroed before) += dy scattered through argmax; one thread per dy
// element, atomics where windows overlap. Out-of-plane indices (corrupt
// argmax; the CPU path throws) are skipped: a kernel cannot throw.
template <class I>
__global__ void maxpool_backward_atomic_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ dx, I total, I ohw, I hw) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I plane = i / ohw;
    const int32_t k = argmax[i];
    if (k >= 0 && static_cast<I>(k) < hw) atomicAdd(dx + plane * hw + k, dy[i]);
  }
}

// Deterministic variant (ctx.math.deterministic): one thread per plane adds
// its outputs in order, as the CPU path does.
template <class I>
__global__ void maxpool_backward_serial_kernel(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                               float* __restrict__ dx, I planes, I ohw, I hw) {
  for (I p = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); p < planes;
       p += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const float* g = dy + p * ohw;
    const int32_t* a = argmax + p * ohw;
    float* d = dx + p * hw;
    for (I i = 0; i < ohw; ++i) {
      const int32_t k = a[i];
      if (k >= 0 && static_cast<I>(k) < hw) d[k] += g[i];
    }
  }
}

// One thread per output: sum of the clipped window / kernel^2.
template <class I>
__global__ void avgpool_forward_kernel(const float* __restrict__ x, float* __restrict__ y, I total, PoolDims<I> d,
                                       float inv) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I oj = i % d.ow, t = i / d.ow;
    const I oi = t % d.oh, plane = t / d.oh;
    I h0, h1, w0, w1;
    window(oi, d.k, d.stride, d.pad, d.h, h0, h1);
    window(oj, d.k, d.stride, d.pad, d.w, w0, w1);
    const float* xs = x + plane * d.h * d.w;
    float s = 0.0f;
    for (I r = h0; r < h1; ++r)
      for (I c = w0; c < w1; ++c) s += xs[r * d.w + c];
    y[i] = s * inv;
  }
}

// Output indices o whose window [o*stride - pad, o*stride - pad + k) holds
// input index r: [ceil((r + pad - k + 1) / stride), floor((r + pad) / stride)],
// clipped to [0, out).
template <class I>
__device__ __forceinline__ void covering(I r, I k, I stride, I pad, I out, I& lo, I& hi) {
  const I num = r + pad - k + 1;
  lo = num <= 0 ? I(0) : (num + stride - 1) / stride;
  const I last = (r + pad) / stride;
  hi = last + 1 < out ? last + 1 : out;  // exclusive
}

// One thread per input element: gathers dy * inv over every window holding
// it (=). Deterministic, no atomics.
template <class I>
__global__ void avgpool_backward_kernel(const float* __restrict__ dy, float* __restrict__ dx, I total, PoolDims<I> d,
                                        float inv) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I c = i % d.w, t = i / d.w;
    const I r = t % d.h, plane = t / d.h;
    I i0, i1, j0, j1;
    covering(r, d.k, d.stride, d.pad, d.oh, i0, i1);
    covering(c, d.k, d.stride, d.pad, d.ow, j0, j1);
    const float* g = dy + plane * d.oh * d.ow;
    float s = 0.0f;
    for (I oi = i0; oi < i1; ++oi)
      for (I oj = j0; oj < j1; ++oj) s += g[oi * d.ow + oj] * inv;
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
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x))
    dx[i] = dy[i / hw] * inv;
}

}  // namespace

void maxpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const int64_t total = y.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(std::max(x.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    maxpool_forward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), argmax.data<int32_t>(), static_cast<I>(total), pool_dims<I>(x.shape(), y.shape(), g));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void maxpool2d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  if (dx.numel() == 0) return;
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  FANOUT_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), st));
  const int64_t total = dy.numel();
  if (total == 0) return;
  const int64_t planes = dy.size(0) * dy.size(1), ohw = dy.size(2) * dy.size(3), hw = dx.size(2) * dx.size(3);
  detail::dispatch_index(std::max(dx.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    if (ctx.math.deterministic) {
      maxpool_backward_serial_kernel<I><<<detail::grid_for(ctx, planes, 128), 128, 0, st>>>(
          dy.f32(), argmax.data<int32_t>(), dx.f32(), static_cast<I>(planes), static_cast<I>(ohw),
          static_cast<I>(hw));
    } else {
      maxpool_backward_atomic_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, st>>>(
          dy.f32(), argmax.data<int32_t>(), dx.f32(), static_cast<I>(total), static_cast<I>(ohw),
          static_cast<I>(hw));
    }
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void avgpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const int64_t total = y.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  detail::dispatch_index(std::max(x.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    avgpool_forward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), y.f32(), static_cast<I>(total), pool_dims<I>(x.shape(), y.shape(), g), inv);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void avgpool2d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const int64_t total = dx.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  detail::dispatch_index(std::max(dy.numel(), total), [&](auto tag) {
    using I = decltype(tag);
    avgpool_backward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        dy.f32(), dx.f32(), static_cast<I>(total), pool_dims<I>(dx.shape(), dy.shape(), g), inv);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
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
  const int64_t total = dx.numel(), hw = dx.size(2) * dx.size(3);
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const float inv = 1.0f / static_cast<float>(hw);
  detail::dispatch_index(total, [&](auto tag) {
    using I = decltype(tag);
    global_avg_backward_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        dy.f32(), dx.f32(), static_cast<I>(total), static_cast<I>(hw), inv);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
