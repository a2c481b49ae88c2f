// CUDA softmax, the CPU kernel's arithmetic (kernels/cpu/softmax.cpp): a
// block per row; the row max over the visible entries in float, exp(x - max)
// in float summed in double in block_sum2's fixed tree (results do not
// depend on timing), y = e / sum rounded once; backward's sum(dy * y) the
// same way. Every element is read and written by one thread, after the
// block's reductions, so y may be x and dx may be dy.
#include "kernels/cuda/common.cuh"
#include "kernels/softmax.h"

namespace fanout::kernels::cuda {

namespace {

using detail::block_max_all;
using detail::kMaxRowThreads;
using detail::row_threads;

__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_forward_kernel(const float* x, int64_t n, bool causal, bool empty_nan, float* y) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * n;
  float* yr = y + r * n;
  const int64_t visible = causal ? r % n + 1 : n;  // keys 0..i of query i
  float m = -CUDART_INF_F;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) m = fmaxf(m, xr[k]);
  m = block_max_all(m);
  if (m == -CUDART_INF_F) {  // every visible entry -inf or NaN (the whole block takes this branch)
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) yr[k] = empty_nan && k < visible ? CUDART_NAN_F : 0.0f;
    return;
  }
  double sum = 0.0, unused = 0.0;
  for (int64_t k = threadIdx.x; k < visible; k += blockDim.x) sum += expf(__fsub_rn(xr[k], m));
  detail::block_sum2_all(sum, unused);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
    yr[k] = k < visible ? static_cast<float>(expf(__fsub_rn(xr[k], m)) / sum) : 0.0f;
}

__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_backward_kernel(const float* y, const float* dy, int64_t n, float* dx) {
  const int64_t r = blockIdx.x;
  const float *yr = y + r * n, *gr = dy + r * n;
  float* dr = dx + r * n;
  double dot = 0.0, unused = 0.0;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) dot += static_cast<double>(gr[k]) * yr[k];
  detail::block_sum2_all(dot, unused);
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
    dr[k] = static_cast<float>(yr[k] * (static_cast<double>(gr[k]) - dot));
}

}  // namespace

namespace detail {

void softmax_forward_rows(Context& ctx, const Tensor& x, bool causal, bool empty_nan, Tensor& y) {
  DeviceScope scope(ctx);
  const int64_t n = x.size(-1), rows = x.numel() / n;
  softmax_forward_kernel<<<static_cast<unsigned>(rows), row_threads(n), 0, stream_of(ctx)>>>(x.f32(), n, causal,
                                                                                              empty_nan, y.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void softmax_forward(Context& ctx, const Tensor& x, bool causal, Tensor& y) {
  detail::softmax_forward_rows(ctx, x, causal, /*empty_nan=*/false, y);
}

void softmax_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx) {
  detail::DeviceScope scope(ctx);
  const int64_t n = y.size(-1), rows = y.numel() / n;
  softmax_backward_kernel<<<static_cast<unsigned>(rows), row_threads(n), 0, detail::stream_of(ctx)>>>(
      y.f32(), dy.f32(), n, dx.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
