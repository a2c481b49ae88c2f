// CUDA batch normalization, split as kernels/batchnorm.h (statistics,
// finalize, apply; backward reduce, backward apply); CPU counterparts in
// kernels/cpu/batchnorm.cpp. Tensors are viewed as (N, C, S). Reductions
// accumulate in double (per-thread partials, block tree, then a fixed-order
// sum of per-block partials: deterministic); elementwise passes use
// per-channel constants computed exactly as the CPU path computes them.
#include "kernels/cuda/batchnorm.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

using detail::Planes;
using detail::planes_of;

// ---- reductions ----

// a += x, b += x^2
template <class I>
struct StatsOp {
  const float* x;
  __device__ void operator()(I i, I, double& a, double& b) const {
    const double v = x[i];
    a += v;
    b += v * v;
  }
};
// stats (2, C) = (sum x, sum x^2), written (=)
struct StatsFin {
  float* stats;
  int64_t c;
  __device__ void operator()(int64_t ch, double a, double b) const {
    stats[ch] = static_cast<float>(a);
    stats[c + ch] = static_cast<float>(b);
  }
};

// a += dy, b += dy * (x - mean)
template <class I>
struct GradStatsOp {
  const float* x;
  const float* dy;
  const float* mean;
  __device__ void operator()(I i, I ch, double& a, double& b) const {
    const double g = dy[i];
    a += g;
    b += g * (static_cast<double>(x[i]) - static_cast<double>(mean[ch]));
  }
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

// ---- finalize: one thread per channel, double arithmetic as the CPU path ----

__global__ void finalize_kernel(const float* __restrict__ stats, int64_t c, double inv_count, double unbias,
                                double mom, double eps, float* __restrict__ mean, float* __restrict__ invstd,
                                float* __restrict__ rm, float* __restrict__ rv) {
  for (int64_t ch = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ch < c; ch += int64_t{gridDim.x} * blockDim.x) {
    const double m = static_cast<double>(stats[ch]) * inv_count;
    const double var = fmax(0.0, static_cast<double>(stats[c + ch]) * inv_count - m * m);  // biased
    mean[ch] = static_cast<float>(m);
    invstd[ch] = static_cast<float>(1.0 / sqrt(var + eps));
    if (rm) rm[ch] = static_cast<float>((1.0 - mom) * static_cast<double>(rm[ch]) + mom * m);
    if (rv) rv[ch] = static_cast<float>((1.0 - mom) * static_cast<double>(rv[ch]) + mom * var * unbias);
  }
}

// ---- elementwise passes over (N, C, S) ----

// y = (x - mean) * (invstd * gamma) + beta; y may alias x.
template <class I>
__global__ void apply_kernel(const float* x, const float* __restrict__ mean, const float* __restrict__ invstd,
                             const float* __restrict__ gamma, const float* __restrict__ beta, float* y, I c, I s,
                             I total) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I ch = (i / s) % c;
    const float k = invstd[ch] * gamma[ch];
    y[i] = (x[i] - mean[ch]) * k + beta[ch];
  }
}

// Eval: k = gamma / sqrt(running_var + eps) computed in double as the CPU path.
template <class I>
__global__ void eval_kernel(const float* x, const float* __restrict__ rmean, const float* __restrict__ rvar,
                            const float* __restrict__ gamma, const float* __restrict__ beta, double eps, float* y,
                            I c, I s, I total) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I ch = (i / s) % c;
    const float k = static_cast<float>(static_cast<double>(gamma[ch]) / sqrt(static_cast<double>(rvar[ch]) + eps));
    y[i] = (x[i] - rmean[ch]) * k + beta[ch];
  }
}

// dx = k * (dy - a) - (x - mean) * q, with k = gamma * invstd,
// a = sum_dy / count, q = k * invstd * sum_dy_xhat / count (per channel, from
// double as the CPU path). dx may alias dy.
template <class I>
__global__ void backward_apply_kernel(const float* x, const float* dy, const float* __restrict__ mean,
                                      const float* __restrict__ invstd, const float* __restrict__ gamma,
                                      const float* __restrict__ grad_stats, double inv_count, float* dx, I c, I s,
                                      I total) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < total;
       i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I ch = (i / s) % c;
    const double k = static_cast<double>(gamma[ch]) * static_cast<double>(invstd[ch]);
    const float kf = static_cast<float>(k);
    const float a = static_cast<float>(static_cast<double>(grad_stats[ch]) * inv_count);
    const float q =
        static_cast<float>(k * static_cast<double>(invstd[ch]) * static_cast<double>(grad_stats[c + ch]) * inv_count);
    dx[i] = kf * (dy[i] - a) - (x[i] - mean[ch]) * q;
  }
}

}  // namespace

// x (N, C, ...) -> stats (2, C): row 0 sum x, row 1 sum x^2 (=).
void bn_stats(Context& ctx, const Tensor& x, Tensor& stats) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  detail::channel_reduce<StatsOp>(ctx, p.n, p.c, p.s, StatsFin{stats.f32(), p.c}, x.f32());
}

void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var) {
  const int64_t c = stats.size(1);
  if (c == 0) return;
  detail::DeviceScope scope(ctx);
  const double inv_count = 1.0 / static_cast<double>(count);
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  finalize_kernel<<<static_cast<int>(detail::ceil_div(c, detail::kThreads)), detail::kThreads, 0,
                    detail::stream_of(ctx)>>>(stats.f32(), c, inv_count, unbias, static_cast<double>(momentum),
                                              static_cast<double>(eps), mean.f32(), invstd.f32(),
                                              running_mean ? running_mean->f32() : nullptr,
                                              running_var ? running_var->f32() : nullptr);
  FANOUT_CUDA_CHECK_LAUNCH();
}

// y = (x - mean) * invstd * gamma + beta (=).
void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(total, [&](auto tag) {
    using I = decltype(tag);
    apply_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), mean.f32(), invstd.f32(), gamma.f32(), beta.f32(), y.f32(), static_cast<I>(p.c),
        static_cast<I>(p.s), static_cast<I>(total));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  detail::dispatch_index(total, [&](auto tag) {
    using I = decltype(tag);
    eval_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), running_mean.f32(), running_var.f32(), gamma.f32(), beta.f32(), static_cast<double>(eps), y.f32(),
        static_cast<I>(p.c), static_cast<I>(p.s), static_cast<I>(total));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

// grad_stats (2, C): row 0 sum dy, row 1 sum dy * xhat (=).
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  detail::channel_reduce<GradStatsOp>(ctx, p.n, p.c, p.s, GradStatsFin{grad_stats.f32(), invstd.f32(), p.c}, x.f32(),
                                      dy.f32(), mean.f32());
}

// dx (=) = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  if (total == 0) return;
  detail::DeviceScope scope(ctx);
  const double inv_count = 1.0 / static_cast<double>(count);
  detail::dispatch_index(total, [&](auto tag) {
    using I = decltype(tag);
    backward_apply_kernel<I><<<detail::grid_for(ctx, total), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.f32(), dy.f32(), mean.f32(), invstd.f32(), gamma.f32(), grad_stats.f32(), inv_count, dx.f32(),
        static_cast<I>(p.c), static_cast<I>(p.s), static_cast<I>(total));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
