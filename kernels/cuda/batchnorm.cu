// CUDA batch normalization, split as kernels/batchnorm.h (statistics,
// finalize, apply; backward reduce, backward apply); CPU counterparts in
// kernels/cpu/batchnorm.cpp. Tensors are viewed as (N, C, S), stored NC(S)
// or channels-last N(S)C, in float32, bfloat16 or float16 (read and written
// natively: no staging copies). Reductions accumulate in double (per-thread
// partials, block tree, then a fixed-order sum of per-block partials:
// deterministic); elementwise passes use per-channel constants computed
// exactly as the CPU path computes them.
#include "kernels/batchnorm.h"

#include "kernels/cuda/batchnorm_cudnn.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

using detail::Planes;
using detail::planes_of;
using detail::widen;

// An (N, C, S) tensor's layout, NC(S) or channels-last N(S)C: the channel
// of element i.
template <class I>
struct Layout {
  I c, s;
  bool last;
  __device__ I channel(I i) const { return last ? i % c : (i / s) % c; }
};

// ---- reductions ----

// a += x - k, b += (x - k)^2 with the pivot k = x[0, ch, 0] (the channel's
// first value, near its mean; x - k is exact in double)
template <class T>
struct Stats {
  template <class I>
  struct Op {
    const T* x;
    int64_t pivot_stride;  // between the channels' first elements: S, or 1 channels-last
    __device__ void operator()(I i, I ch, double& a, double& b) const {
      const double v = static_cast<double>(widen(x[i])) - static_cast<double>(widen(x[ch * pivot_stride]));
      a += v;
      b += v * v;
    }
  };
};
// stats (3, C) float64 = (sum x, sum (x - mean)^2, (sum x)^2 / count), written (=)
template <class T>
struct StatsFin {
  double* stats;
  const T* x;
  int64_t c, pivot_stride;
  double count;
  __device__ void operator()(int64_t ch, double a, double b) const {
    const double sum = a + count * static_cast<double>(widen(x[ch * pivot_stride]));
    stats[ch] = sum;
    stats[c + ch] = fmax(0.0, b - a * a / count);
    stats[2 * c + ch] = sum * sum / count;
  }
};

// a += dy, b += dy * (x - mean)
template <class T>
struct GradStats {
  template <class I>
  struct Op {
    const T* x;
    const T* dy;
    const float* mean;  // (2, C): hi, lo
    int64_t c;
    __device__ void operator()(I i, I ch, double& a, double& b) const {
      const double g = widen(dy[i]);
      a += g;
      b += g * (static_cast<double>(widen(x[i])) -
                (static_cast<double>(mean[ch]) + static_cast<double>(mean[c + ch])));
    }
  };
};
// grad_stats (2, C) = (sum dy, sum dy * xhat), written (=)
struct GradStatsFin {
  float* grad_stats;
  const float* invstd;
  int64_t c;
  __device__ void operator()(int64_t ch, double a, double b) const {
    grad_stats[ch] = static_cast<float>(a);
    grad_stats[c + ch] = static_cast<float>(b * static_cast<double>(invstd[ch]));
  }
};

// a += g, b += g * (x - mean) with g = dy where y > 0 else 0, stored into g
// (which may alias dy: each element is read, then written, by one thread).
template <class T>
struct ReluGradStats {
  template <class I>
  struct Op {
    const T* x;
    const T* y;
    const T* dy;
    T* g;
    const float* mean;  // (2, C): hi, lo
    int64_t c;
    __device__ void operator()(I i, I ch, double& a, double& b) const {
      const float gv = widen(y[i]) > 0.0f ? widen(dy[i]) : 0.0f;
      g[i] = detail::narrow<T>(gv);  // exact: gv is dy's value or zero
      a += gv;
      b += static_cast<double>(gv) * (static_cast<double>(widen(x[i])) -
                                      (static_cast<double>(mean[ch]) + static_cast<double>(mean[c + ch])));
    }
  };
};

// ---- finalize: one thread per channel, double arithmetic as the CPU path ----

__global__ void finalize_kernel(const double* __restrict__ stats, int64_t c, double count, double inv_count,
                                double unbias, double mom, double eps, float* __restrict__ mean,
                                float* __restrict__ invstd, float* __restrict__ rm, float* __restrict__ rv) {
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c; ch += int64_t{gridDim.x} * blockDim.x) {
    const double s = stats[ch], m = s * inv_count;
    const double between = fmax(0.0, stats[2 * c + ch] - s * s / count);
    const double var = (stats[c + ch] + between) * inv_count;  // biased
    const float hi = static_cast<float>(m);
    mean[ch] = hi;
    mean[c + ch] = static_cast<float>(m - static_cast<double>(hi));
    invstd[ch] = static_cast<float>(1.0 / sqrt(var + eps));
    if (rm) rm[ch] = static_cast<float>((1.0 - mom) * static_cast<double>(rm[ch]) + mom * m);
    if (rv) rv[ch] = static_cast<float>((1.0 - mom) * static_cast<double>(rv[ch]) + mom * var * unbias);
  }
}

// ---- elementwise passes over (N, C, S) in either layout ----

// What a pass stores: a low-type element rounds as it is stored; a float32
// one is rounded as `low` asks (0: not at all).
// bn_apply, bn_forward_eval and bn_backward_apply write in the output's own
// type: a low one rounded once as stored, a float32 one (a float32 input's,
// which torch's autocast leaves in float32) not at all.
constexpr int kInOwnType = 0;
template <class T>
__device__ __forceinline__ T store(float v, int low) {
  return detail::narrow<T>(detail::round_low(v, low));
}

// y = (x - mean) * (invstd * gamma) + beta; y may alias x.
template <class T, class I>
__global__ void apply_kernel(const T* x, const float* __restrict__ mean, const float* __restrict__ invstd,
                             const float* __restrict__ gamma, const float* __restrict__ beta, T* y, Layout<I> l,
                             I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = l.channel(i);
    const float k = invstd[ch] * gamma[ch];
    y[i] = store<T>(((widen(x[i]) - mean[ch]) - mean[l.c + ch]) * k + beta[ch], low);  // mean (2, C): hi, lo
  }
}

// y = max(r(r(bn(x)) + z), 0) with r the rounding of apply_kernel's store
// (z null: no add); y may alias x or z.
template <class T, class I>
__global__ void apply_add_relu_kernel(const T* x, const float* __restrict__ mean, const float* __restrict__ invstd,
                                      const float* __restrict__ gamma, const float* __restrict__ beta, const T* z,
                                      T* y, Layout<I> l, I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = l.channel(i);
    const float k = invstd[ch] * gamma[ch];
    float v = widen(store<T>(((widen(x[i]) - mean[ch]) - mean[l.c + ch]) * k + beta[ch], low));
    if (z) v = widen(store<T>(v + widen(z[i]), low));
    y[i] = detail::narrow<T>(v < 0.0f ? 0.0f : v);  // NaN propagates, as relu_forward
  }
}

// Eval: k = gamma / sqrt(running_var + eps) computed in double as the CPU path.
template <class T, class I>
__global__ void eval_kernel(const T* x, const float* __restrict__ rmean, const float* __restrict__ rvar,
                            const float* __restrict__ gamma, const float* __restrict__ beta, double eps, T* y,
                            Layout<I> l, I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = l.channel(i);
    const float k = static_cast<float>(static_cast<double>(gamma[ch]) / sqrt(static_cast<double>(rvar[ch]) + eps));
    y[i] = store<T>((widen(x[i]) - rmean[ch]) * k + beta[ch], low);
  }
}

// dx = k * (dy - a) - (x - mean) * q, with k = gamma * invstd,
// a = sum_dy / count, q = k * invstd * sum_dy_xhat / count (per channel, from
// double as the CPU path). dx may alias dy.
template <class T, class I>
__global__ void backward_apply_kernel(const T* x, const T* dy, const float* __restrict__ mean,
                                      const float* __restrict__ invstd, const float* __restrict__ gamma,
                                      const float* __restrict__ grad_stats, double inv_count, T* dx, Layout<I> l,
                                      I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = l.channel(i);
    const double k = static_cast<double>(gamma[ch]) * static_cast<double>(invstd[ch]);
    const float kf = static_cast<float>(k);
    const float a = static_cast<float>(static_cast<double>(grad_stats[ch]) * inv_count);
    const float q = static_cast<float>(k * static_cast<double>(invstd[ch]) *
                                       static_cast<double>(grad_stats[l.c + ch]) * inv_count);
    dx[i] = store<T>(kf * (widen(dy[i]) - a) - ((widen(x[i]) - mean[ch]) - mean[l.c + ch]) * q, low);
  }
}

// launch(T{}, I{}, Layout<I>, blocks, stream) over x's elements, T its storage.
template <class Launch>
void per_element(Context& ctx, const Tensor& x, Launch&& launch) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  detail::with_storage(x.dtype(), [&](auto t) {
    detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
      using I = decltype(tag);
      launch(t, tag, Layout<I>{static_cast<I>(p.c), static_cast<I>(p.s), x.channels_last()}, static_cast<I>(total),
             blocks, st);
    });
  });
}

}  // namespace

// The entry points take x, y, dy and dx in any floating storage and either
// format, all alike (kernels/batchnorm.cpp checks), natively.

// x (N, C, ...) -> stats (3, C) float64 (=), as kernels/batchnorm.h.
void bn_stats(Context& ctx, const Tensor& x, Tensor& stats) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  if (p.n * p.s == 0) {
    FANOUT_CUDA_CHECK(cudaMemsetAsync(stats.raw(), 0, stats.nbytes(), detail::stream_of(ctx)));
    return;
  }
  const double count = static_cast<double>(p.n * p.s);
  const bool last = x.channels_last();
  detail::with_storage(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const int64_t pivot_stride = last ? 1 : p.s;
    detail::channel_reduce_stored<Stats<T>::template Op>(ctx, p.n, p.c, p.s, last, StatsFin<T>{stats.f64(), x.data<T>(), p.c, pivot_stride, count},
                                           x.data<T>(), pivot_stride);
  });
}

void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var) {
  const int64_t c = stats.size(1);
  if (c == 0) return;
  detail::DeviceScope scope(ctx);
  const double inv_count = 1.0 / static_cast<double>(count);
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  finalize_kernel<<<static_cast<int>(detail::ceil_div(c, detail::kThreads)), detail::kThreads, 0,
                    detail::stream_of(ctx)>>>(stats.f64(), c, static_cast<double>(count), inv_count, unbias,
                                              static_cast<double>(momentum),
                                              static_cast<double>(eps), mean.f32(), invstd.f32(),
                                              running_mean ? running_mean->f32() : nullptr,
                                              running_var ? running_var->f32() : nullptr);
  FANOUT_CUDA_CHECK_LAUNCH();
}

// y = (x - mean) * invstd * gamma + beta (=).
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y) {
  per_element(ctx, x, [&](auto t, auto, auto l, auto total, int blocks, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(total);
    apply_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(x.data<T>(), mean.f32(), invstd.f32(), gamma.f32(),
                                                            beta.f32(), y.data<T>(), l, total, kInOwnType);
  });
}

void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round) {
  per_element(ctx, x, [&](auto t, auto, auto l, auto total, int blocks, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(total);
    apply_add_relu_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(
        x.data<T>(), mean.f32(), invstd.f32(), gamma.f32(), beta.f32(), z ? z->data<T>() : nullptr, y.data<T>(), l,
        total, detail::low_mode(round));
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  per_element(ctx, x, [&](auto t, auto, auto l, auto total, int blocks, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(total);
    eval_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(x.data<T>(), running_mean.f32(), running_var.f32(),
                                                           gamma.f32(), beta.f32(), static_cast<double>(eps),
                                                           y.data<T>(), l, total, kInOwnType);
  });
}

// grad_stats (2, C): row 0 sum dy, row 1 sum dy * xhat (=).
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  detail::with_storage(x.dtype(), [&](auto t) {
    using T = decltype(t);
    detail::channel_reduce_stored<GradStats<T>::template Op>(ctx, p.n, p.c, p.s, x.channels_last(),
                                               GradStatsFin{grad_stats.f32(), invstd.f32(), p.c}, x.data<T>(),
                                               dy.data<T>(), mean.f32(), p.c);
  });
}

// g (=) = dy where y > 0 else 0; grad_stats (2, C) of g as bn_backward_reduce.
void bn_backward_reduce_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                             const Tensor& invstd, Tensor& grad_stats, Tensor& g) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  detail::with_storage(x.dtype(), [&](auto t) {
    using T = decltype(t);
    detail::channel_reduce_stored<ReluGradStats<T>::template Op>(
        ctx, p.n, p.c, p.s, x.channels_last(), GradStatsFin{grad_stats.f32(), invstd.f32(), p.c}, x.data<T>(),
        y.data<T>(), dy.data<T>(), g.data<T>(), mean.f32(), p.c);
  });
}

// dx (=) = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  const double inv_count = 1.0 / static_cast<double>(count);
  per_element(ctx, x, [&](auto t, auto, auto l, auto total, int blocks, cudaStream_t st) {
    using T = decltype(t);
    using I = decltype(total);
    backward_apply_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(
        x.data<T>(), dy.data<T>(), mean.f32(), invstd.f32(), gamma.f32(), grad_stats.f32(), inv_count,
        dx.data<T>(), l, total, kInOwnType);
  });
}

int64_t bn_relu_mask_bytes(const Context&, const Tensor& x) { return cudnn_bn_mask_bytes(x); }

// cuDNN's fused graph where it takes the tensors (kernels/cuda/batchnorm_cudnn.cu), else the split kernels.
bool bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma, const Tensor& beta,
                       float eps, float momentum, Tensor& stats, Tensor& mean, Tensor& invstd,
                       Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor* relu_mask, DType round) {
  bool mask_written = false;
  if (cudnn_bn_train_add_relu(ctx, x, z, gamma, beta, eps, momentum, mean, invstd, running_mean, running_var, y,
                              relu_mask, mask_written))
    return mask_written;
  bn_stats(ctx, x, stats);
  bn_finalize(ctx, stats, x.numel() / x.size(1), eps, momentum, mean, invstd, &running_mean, &running_var);
  bn_apply_add_relu(ctx, x, mean, invstd, gamma, beta, z, y, round);
  return false;
}

void bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                      const Tensor& invstd, const Tensor& gamma, const Tensor* relu_mask, Tensor& grad_stats,
                      Tensor& g, Tensor& dx) {
  if (cudnn_bn_backward_relu(ctx, x, y, dy, mean, invstd, gamma, relu_mask, grad_stats, g, dx)) return;
  bn_backward_reduce_relu(ctx, x, y, dy, mean, invstd, grad_stats, g);
  bn_backward_apply(ctx, x, g, mean, invstd, gamma, grad_stats, x.numel() / x.size(1), dx);
}

}  // namespace fanout::kernels::cuda
