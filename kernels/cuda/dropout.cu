// CUDA dropout: kernels/dropout.h's hash per element, a grid-stride loop;
// the same mask and values as the CPU kernel, bit for bit, in every
// storage type and format.
#include "kernels/cuda/common.cuh"
#include "kernels/dropout.h"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {
// c, s: channels and spatial elements of a channels-last row (1, 1 when
// contiguous); the draw takes the logical index, as the CPU kernel.
template <class T>
__global__ void dropout_kernel(const T* x, float p, uint64_t key, int64_t first_row, int64_t row_stride,
                               int64_t sample, int64_t c, int64_t s, int64_t n, T* y) {
  const float scale = dropout_math::scale(p);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / sample, m = i - r * sample, e = c == 1 ? m : (m % c) * s + m / c;
    y[i] = detail::narrow<T>(dropout_math::keep(key, first_row + r * row_stride, e, p)
                                 ? __fmul_rn(detail::widen(x[i]), scale)
                                 : 0.0f);
  }
}
}  // namespace

void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, int64_t row_stride, Tensor& y) {
  detail::DeviceScope scope(ctx);
  const int64_t n = x.numel(), sample = n / x.size(0);
  const int64_t c = x.channels_last() ? x.size(1) : 1, s = sample / c;
  detail::with_storage(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<detail::grid_for(ctx, n), detail::kThreads, 0, detail::stream_of(ctx)>>>(
        x.data<T>(), p, key, first_row, row_stride, sample, c, s, n, y.data<T>());
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
