// CPU fully connected layer: GEMMs through OpenBLAS.
#include "kernels/cpu/linear.h"

#include <algorithm>

#include "kernels/cpu/gemm.h"

namespace fanout::kernels::cpu {

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  float* yp = y.f32();  // (N, out)
  if (b) {
    // y = b broadcast over rows, then y += x W^T.
    const float* bp = b->f32();
    for (int64_t i = 0; i < n; ++i) std::copy(bp, bp + out, yp + i * out);
  }
  gemm(ctx, false, true, n, out, in, 1.0f, x.f32(), in, w.f32(), in, b ? 1.0f : 0.0f, yp, out);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float* dyp = dy.f32();  // (N, out)
  // dx (N, in) = dy W, written (=).
  if (dx) gemm(ctx, false, false, n, in, out, 1.0f, dyp, out, w.f32(), in, 0.0f, dx->f32(), in);
  // dw (out, in) += dy^T x.
  gemm(ctx, true, false, out, in, n, 1.0f, dyp, out, x.f32(), in, 1.0f, dw.f32(), in);
  if (db) {
    // db (out) += column sums of dy; rows are contiguous so the inner loop vectorizes.
    float* dbp = db->f32();
    for (int64_t i = 0; i < n; ++i) {
      const float* row = dyp + i * out;
      for (int64_t j = 0; j < out; ++j) dbp[j] += row[j];
    }
  }
}

}  // namespace fanout::kernels::cpu
