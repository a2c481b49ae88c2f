// CUDA layer normalization, the CPU kernel's arithmetic (kernels/cpu/layernorm.cpp):
// a block per row for the statistics, the output and dx (sums in double,
// reduced in a fixed tree, so results do not depend on timing); dgamma and
// dbeta in double through the two fixed-order passes of
// detail::channel_reduce_stored (blocks of rows, then their partial sums in
// order), before dx (dx may alias dy).
#include "kernels/cuda/common.cuh"
#include "kernels/layernorm.h"

namespace fanout::kernels::cuda {

namespace {

constexpr int kLnThreads = 256;

__global__ void __launch_bounds__(kLnThreads)
    ln_forward_kernel(const float* x, const float* gamma, const float* beta, int64_t d, float eps, float* y,
                      float* mean, float* rstd) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  double mu, rs;
  detail::block_row_moments(xr, d, eps, mu, rs);
  if (threadIdx.x == 0) {
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(rs);
  }
  const float muf = static_cast<float>(mu), rf = static_cast<float>(rs);
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x)
    y[r * d + k] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[k], muf), rf), gamma[k]), beta[k]);
}

// dgamma += sum over rows of dy * xhat, dbeta += sum of dy: element i of the
// (rows, d) matrix is in row i / d and column k.
template <class I>
struct ParamGrad {
  const float* x;
  const float* dy;
  const float* mean;
  const float* rstd;
  int64_t d;
  __device__ void operator()(I i, I k, double& sg, double& sb) const {
    const I r = i / static_cast<I>(d);
    const double xh = (x[i] - static_cast<double>(mean[r])) * rstd[r];
    sg += dy[i] * xh;
    sb += dy[i];
  }
};
struct ParamGradFin {
  float* dgamma;
  float* dbeta;
  __device__ void operator()(int64_t k, double sg, double sb) const {
    dgamma[k] += static_cast<float>(sg);
    dbeta[k] += static_cast<float>(sb);
  }
};

__global__ void __launch_bounds__(kLnThreads)
    ln_dx_kernel(const float* x, const float* dy, const float* gamma, const float* mean, const float* rstd, int64_t d,
                 float* dx) {
  const int64_t r = blockIdx.x;
  detail::block_row_dx(x + r * d, dy + r * d, d, mean[r], rstd[r], [&](int64_t k) { return gamma[k]; }, dx + r * d);
}

}  // namespace

void layer_norm_forward(Context& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                        Tensor& mean, Tensor& rstd) {
  detail::DeviceScope scope(ctx);
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  FANOUT_CHECK(rows <= INT32_MAX) << "layer_norm_forward: " << rows << " rows";
  ln_forward_kernel<<<static_cast<unsigned>(rows), kLnThreads, 0, detail::stream_of(ctx)>>>(
      x.f32(), gamma.f32(), beta.f32(), d, eps, y.f32(), mean.f32(), rstd.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

void layer_norm_backward(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& rstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  detail::DeviceScope scope(ctx);
  const int64_t d = gamma.numel(), rows = x.numel() / d;
  FANOUT_CHECK(rows <= INT32_MAX) << "layer_norm_backward: " << rows << " rows";
  cudaStream_t st = detail::stream_of(ctx);
  detail::channel_reduce_stored<ParamGrad>(ctx, rows, d, 1, true, ParamGradFin{dgamma.f32(), dbeta.f32()}, x.f32(),
                                           dy.f32(), mean.f32(), rstd.f32(), d);
  ln_dx_kernel<<<static_cast<unsigned>(rows), kLnThreads, 0, st>>>(x.f32(), dy.f32(), gamma.f32(), mean.f32(),
                                                                    rstd.f32(), d, dx.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
