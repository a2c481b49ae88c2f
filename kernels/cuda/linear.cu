// CUDA fully connected layer: cuBLAS GEMMs, the bias broadcast and the bias
// gradient (detail::channel_sum_add); CPU counterpart in kernels/cpu/linear.cpp.
// x, y, dy, dx and w are float32 or, under autocast, of its low type, read
// and written as they are (detail::gemm_ex). Under autocast the kernels round in
// the low type (kernels::linear_rounds_in_low_type): gemm_ex narrows float32
// operands, a float32 y or dx is rounded after its product, and dW's term
// goes through a low-type buffer before it is added.
#include "kernels/convert.h"
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

bool linear_rounds_in_low_type(const Context& ctx) { return ctx.math.autocast != DType::F32; }

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
  detail::gemm_ex(ctx, false, true, n, out, in, 1.0f, x.raw(), x.dtype(), in, w.raw(), w.dtype(), in,
                  b ? 1.0f : 0.0f, y.raw(), y.dtype(), out);
  if (detail::low_precision(ctx) && y.dtype() == DType::F32) round_to(ctx, y, ctx.math.autocast);
}

// dy (N, out). dx (N, in) = dy W (=) when non-null; dw += dy^T x; db += column sums of dy.
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  detail::DeviceScope scope(ctx);
  const bool low = detail::low_precision(ctx);
  if (dx) {
    detail::gemm_ex(ctx, false, false, n, in, out, 1.0f, dy.raw(), dy.dtype(), out, w.raw(), w.dtype(), in, 0.0f,
                    dx->raw(), dx->dtype(), in);
    if (low && dx->dtype() == DType::F32) round_to(ctx, *dx, ctx.math.autocast);
  }
  if (low && n > 0) {
    // dW's term rounded to the low type (beta 0), then added to dw.
    Tensor term = detail::low_buffer(ctx, 2, dw.shape());
    detail::gemm_ex(ctx, true, false, out, in, n, 1.0f, dy.raw(), dy.dtype(), out, x.raw(), x.dtype(), in, 0.0f,
                    term.raw(), term.dtype(), in);
    detail::add_widened(ctx, term, dw.f32());
  } else if (!low) {
    detail::gemm_ex(ctx, true, false, out, in, n, 1.0f, dy.raw(), dy.dtype(), out, x.raw(), x.dtype(), in, 1.0f,
                    dw.f32(), DType::F32, in);
  }
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
