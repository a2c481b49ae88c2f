// CUDA dropout: kernels/dropout.h's hash per element, a grid-stride loop;
// the same mask and values as the CPU kernel, bit for bit.
#include "kernels/cuda/common.cuh"
#include "kernels/dropout.h"

namespace fanout::kernels::cuda {

namespace {
__global__ void dropout_kernel(const float* x, float p, uint64_t key, int64_t first_row, int64_t sample, int64_t n,
                               float* y) {
  const float s = dropout_math::scale(p);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / sample, e = i - r * sample;
    y[i] = dropout_math::keep(key, first_row + r, e, p) ? __fmul_rn(x[i], s) : 0.0f;
  }
}
}  // namespace

void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, Tensor& y) {
  detail::DeviceScope scope(ctx);
  const int64_t n = x.numel(), sample = n / x.size(0);
  dropout_kernel<<<detail::grid_for(ctx, n), detail::kThreads, 0, detail::stream_of(ctx)>>>(x.f32(), p, key, first_row,
                                                                                            sample, n, y.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
