// CUDA batch normalization, split as kernels/batchnorm.h (statistics,
// finalize, apply; backward reduce, backward apply); CPU counterparts in
// kernels/cpu/batchnorm.cpp. Tensors are viewed as (N, C, S). Reductions
// accumulate in double (per-thread partials, block tree, then a fixed-order
// sum of per-block partials: deterministic); elementwise passes use
// per-channel constants computed exactly as the CPU path computes them.
#include "kernels/batchnorm.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

using detail::Planes;
using detail::planes_of;

// ---- reductions ----

// a += x - k, b += (x - k)^2 with the pivot k = x[0, ch, 0] (the channel's
// first value, near its mean; x - k is exact in double)
template <class I>
struct StatsOp {
  const float* x;
  int64_t s;
  __device__ void operator()(I i, I ch, double& a, double& b) const {
    const double v = static_cast<double>(x[i]) - static_cast<double>(x[static_cast<int64_t>(ch) * s]);
    a += v;
    b += v * v;
  }
};
// stats (3, C) float64 = (sum x, sum (x - mean)^2, (sum x)^2 / count), written (=)
struct StatsFin {
  double* stats;
  const float* x;
  int64_t c, s;
  double count;
  __device__ void operator()(int64_t ch, double a, double b) const {
    const double sum = a + count * static_cast<double>(x[ch * s]);
    stats[ch] = sum;
    stats[c + ch] = fmax(0.0, b - a * a / count);
    stats[2 * c + ch] = sum * sum / count;
  }
};

// a += dy, b += dy * (x - mean)
template <class I>
struct GradStatsOp {
  const float* x;
  const float* dy;
  const float* mean;  // (2, C): hi, lo
  int64_t c;
  __device__ void operator()(I i, I ch, double& a, double& b) const {
    const double g = dy[i];
    a += g;
    b += g * (static_cast<double>(x[i]) - (static_cast<double>(mean[ch]) + static_cast<double>(mean[c + ch])));
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

// ---- elementwise passes over (N, C, S) ----

// y = (x - mean) * (invstd * gamma) + beta; y may alias x. Each kernel here
// rounds what it writes as autocast asks (low: detail::low_mode).
template <class I>
__global__ void apply_kernel(const float* x, const float* __restrict__ mean, const float* __restrict__ invstd,
                             const float* __restrict__ gamma, const float* __restrict__ beta, float* y, I c, I s,
                             I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = (i / s) % c;
    const float k = invstd[ch] * gamma[ch];
    y[i] = detail::round_low(((x[i] - mean[ch]) - mean[c + ch]) * k + beta[ch], low);  // mean (2, C): hi, lo
  }
}

// Eval: k = gamma / sqrt(running_var + eps) computed in double as the CPU path.
template <class I>
__global__ void eval_kernel(const float* x, const float* __restrict__ rmean, const float* __restrict__ rvar,
                            const float* __restrict__ gamma, const float* __restrict__ beta, double eps, float* y,
                            I c, I s, I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = (i / s) % c;
    const float k = static_cast<float>(static_cast<double>(gamma[ch]) / sqrt(static_cast<double>(rvar[ch]) + eps));
    y[i] = detail::round_low((x[i] - rmean[ch]) * k + beta[ch], low);
  }
}

// dx = k * (dy - a) - (x - mean) * q, with k = gamma * invstd,
// a = sum_dy / count, q = k * invstd * sum_dy_xhat / count (per channel, from
// double as the CPU path). dx may alias dy.
template <class I>
__global__ void backward_apply_kernel(const float* x, const float* dy, const float* __restrict__ mean,
                                      const float* __restrict__ invstd, const float* __restrict__ gamma,
                                      const float* __restrict__ grad_stats, double inv_count, float* dx, I c, I s,
                                      I total, int low) {
  for (I i : detail::grid_stride(total)) {
    const I ch = (i / s) % c;
    const double k = static_cast<double>(gamma[ch]) * static_cast<double>(invstd[ch]);
    const float kf = static_cast<float>(k);
    const float a = static_cast<float>(static_cast<double>(grad_stats[ch]) * inv_count);
    const float q =
        static_cast<float>(k * static_cast<double>(invstd[ch]) * static_cast<double>(grad_stats[c + ch]) * inv_count);
    dx[i] = detail::round_low(kf * (dy[i] - a) - ((x[i] - mean[ch]) - mean[c + ch]) * q, low);
  }
}

}  // namespace

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
  detail::channel_reduce<StatsOp>(ctx, p.n, p.c, p.s, StatsFin{stats.f64(), x.f32(), p.c, p.s, count}, x.f32(),
                                  p.s);
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
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    apply_kernel<I><<<blocks, detail::kThreads, 0, st>>>(x.f32(), mean.f32(), invstd.f32(), gamma.f32(),
                                                         beta.f32(), y.f32(), static_cast<I>(p.c),
                                                         static_cast<I>(p.s), static_cast<I>(total),
                                                         detail::low_mode(ctx));
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    eval_kernel<I><<<blocks, detail::kThreads, 0, st>>>(x.f32(), running_mean.f32(), running_var.f32(), gamma.f32(),
                                                        beta.f32(), static_cast<double>(eps), y.f32(),
                                                        static_cast<I>(p.c), static_cast<I>(p.s),
                                                        static_cast<I>(total), detail::low_mode(ctx));
  });
}

// grad_stats (2, C): row 0 sum dy, row 1 sum dy * xhat (=).
void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const Planes p = planes_of(x);
  if (p.c == 0) return;
  detail::DeviceScope scope(ctx);
  detail::channel_reduce<GradStatsOp>(ctx, p.n, p.c, p.s, GradStatsFin{grad_stats.f32(), invstd.f32(), p.c}, x.f32(),
                                      dy.f32(), mean.f32(), p.c);
}

// dx (=) = gamma * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count).
void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  const Planes p = planes_of(x);
  const int64_t total = x.numel();
  const double inv_count = 1.0 / static_cast<double>(count);
  detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    backward_apply_kernel<I><<<blocks, detail::kThreads, 0, st>>>(
        x.f32(), dy.f32(), mean.f32(), invstd.f32(), gamma.f32(), grad_stats.f32(), inv_count, dx.f32(),
        static_cast<I>(p.c), static_cast<I>(p.s), static_cast<I>(total), detail::low_mode(ctx));
  });
}

}  // namespace fanout::kernels::cuda
