// CUDA group normalization, the CPU kernel's arithmetic (kernels/cpu/groupnorm.cpp):
// a block per (sample, group) for the statistics, the output and dx (sums in
// double, reduced in a fixed tree, so results do not depend on timing); a
// block per channel for dgamma and dbeta, before dx (dx may alias dy).
#include "kernels/cuda/common.cuh"
#include "kernels/groupnorm.h"

namespace fanout::kernels::cuda {

namespace {

constexpr int kGnThreads = 256;

__global__ void __launch_bounds__(kGnThreads)
    gn_forward_kernel(const float* x, const float* gamma, const float* beta, int64_t c, int64_t s, int groups, float eps,
                      float* y, float* mean, float* rstd) {
  const int64_t ng = blockIdx.x, i = ng / groups, gr = ng % groups, cg = c / groups, m = cg * s;
  const int64_t base = (i * c + gr * cg) * s;
  double mu, r;
  detail::block_row_moments(x + base, m, eps, mu, r);
  if (threadIdx.x == 0) {
    mean[ng] = static_cast<float>(mu);
    rstd[ng] = static_cast<float>(r);
  }
  const float rf = static_cast<float>(r), muf = static_cast<float>(mu);
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const int64_t cc = gr * cg + k / s;
    const float scale = __fmul_rn(rf, gamma[cc]);
    const float shift = __fsub_rn(beta[cc], __fmul_rn(muf, scale));
    y[base + k] = __fadd_rn(__fmul_rn(x[base + k], scale), shift);
  }
}

__global__ void __launch_bounds__(kGnThreads)
    gn_param_grad_kernel(const float* x, const float* dy, const float* mean, const float* rstd, int64_t n, int64_t c,
                         int64_t s, int groups, float* dgamma, float* dbeta) {
  const int64_t cc = blockIdx.x, gr = cc / (c / groups);
  double sg = 0, sb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double mu = mean[i * groups + gr], r = rstd[i * groups + gr];
    const float* xr = x + (i * c + cc) * s;
    const float* dr = dy + (i * c + cc) * s;
    for (int64_t k = threadIdx.x; k < s; k += blockDim.x) {
      sg += dr[k] * ((xr[k] - mu) * r);
      sb += dr[k];
    }
  }
  detail::block_sum2(sg, sb);
  if (threadIdx.x == 0) {
    dgamma[cc] += static_cast<float>(sg);
    dbeta[cc] += static_cast<float>(sb);
  }
}

__global__ void __launch_bounds__(kGnThreads)
    gn_dx_kernel(const float* x, const float* dy, const float* gamma, const float* mean, const float* rstd, int64_t c,
                 int64_t s, int groups, float* dx) {
  const int64_t ng = blockIdx.x, i = ng / groups, gr = ng % groups, cg = c / groups, m = cg * s;
  const int64_t base = (i * c + gr * cg) * s;
  const float* g = gamma + gr * cg;
  detail::block_row_dx(x + base, dy + base, m, mean[ng], rstd[ng], [&](int64_t k) { return g[k / s]; }, dx + base);
}

}  // namespace

void group_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, int groups, float eps,
                        Tensor& y, Tensor& mean, Tensor& rstd) {
  detail::DeviceScope scope(ctx);
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  FANOUT_CHECK(n * groups <= INT32_MAX) << "group_norm_forward: " << n * groups << " groups in all";
  gn_forward_kernel<<<static_cast<unsigned>(n * groups), kGnThreads, 0, detail::stream_of(ctx)>>>(
      x.f32(), gamma.f32(), beta.f32(), c, s, groups, eps, y.f32(), mean.f32(), rstd.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

void group_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, int groups, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  detail::DeviceScope scope(ctx);
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  FANOUT_CHECK(n * groups <= INT32_MAX && c <= INT32_MAX) << "group_norm_backward: too many groups";
  cudaStream_t st = detail::stream_of(ctx);
  gn_param_grad_kernel<<<static_cast<unsigned>(c), kGnThreads, 0, st>>>(x.f32(), dy.f32(), mean.f32(), rstd.f32(), n,
                                                                          c, s, groups, dgamma.f32(), dbeta.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
  gn_dx_kernel<<<static_cast<unsigned>(n * groups), kGnThreads, 0, st>>>(x.f32(), dy.f32(), gamma.f32(), mean.f32(),
                                                                          rstd.f32(), c, s, groups, dx.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
