// CUDA fully connected layer: cuBLAS GEMMs, the bias broadcast and the bias
// gradient (detail::channel_sum_add); CPU counterpart in kernels/cpu/linear.cpp.
// x, y, dy and dx are float32 or, under autocast, of its low type, read and
// written as they are (detail::gemm_ex).
#include "kernels/linear.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {
// y (rows, cols) = b broadcast over rows, written (=) in y's storage.
template <class T, class I>
__global__ void broadcast_rows_kernel(const float* __restrict__ b, T* __restrict__ y, I rows, I cols) {
  const I total = rows * cols;
  for (I i : detail::grid_stride(total))
    y[i] = detail::narrow<T>(b[i % cols]);
}

}  // namespace

// x (N, in), w (out, in), b (out) or null; y (N, out) written (=).
void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  if (n == 0 || out == 0) return;
  detail::DeviceScope scope(ctx);
  if (b) {
    // y = b broadcast over rows, then y += x W^T (as the CPU path). Under
    // autocast b holds low-type values (the layer casts it), so a low-type y
    // holds b exactly and is rounded once, after the sum.
    detail::with_storage(y.dtype(), [&](auto t) {
      using T = decltype(t);
      detail::launch_per_element(ctx, n * out, n * out, [&](auto tag, int blocks, cudaStream_t st) {
        using I = decltype(tag);
        broadcast_rows_kernel<T, I><<<blocks, detail::kThreads, 0, st>>>(b->f32(), y.data<T>(), static_cast<I>(n),
                                                                         static_cast<I>(out));
      });
    });
  }
  detail::gemm_ex(ctx, false, true, n, out, in, 1.0f, x.raw(), x.dtype(), in, w.f32(), DType::F32, in,
                  b ? 1.0f : 0.0f, y.raw(), y.dtype(), out);
}

// dy (N, out). dx (N, in) = dy W (=) when non-null; dw += dy^T x; db += column sums of dy.
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  detail::DeviceScope scope(ctx);
  if (dx)
    detail::gemm_ex(ctx, false, false, n, in, out, 1.0f, dy.raw(), dy.dtype(), out, w.f32(), DType::F32, in, 0.0f,
                    dx->raw(), dx->dtype(), in);
  detail::gemm_ex(ctx, true, false, out, in, n, 1.0f, dy.raw(), dy.dtype(), out, x.raw(), x.dtype(), in, 1.0f,
                  dw.f32(), DType::F32, in);
  if (db && out > 0 && n > 0) {
    // Rows in parallel blocks, in double (a thread per column over every row
    // in order left the GPU nearly idle: 8192 rows of GPT-2 took milliseconds).
    detail::with_storage(dy.dtype(), [&](auto t) {
      using T = decltype(t);
      detail::channel_sum_add(ctx, dy.data<T>(), n, out, 1, true, db->f32());
    });
  }
}

}  // namespace fanout::kernels::cuda
