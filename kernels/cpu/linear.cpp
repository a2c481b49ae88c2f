// CPU fully connected layer: GEMMs through OpenBLAS, or, with
// math.split_invariant, row-by-row loops whose summation order does not
// depend on the number of rows (OpenBLAS's does).
#include "kernels/cpu/linear.h"

#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/loops.h"

namespace fanout::kernels::cpu {

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();  // (N, out)
  if (ctx.math.split_invariant) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t o = 0; o < out; ++o)
        yp[i * out + o] = (bp ? bp[o] : 0.0f) + dot_f32(xp + i * in, wp + o * in, in);
    return;
  }
  // y = b broadcast over rows, then y += x W^T.
  if (bp)
    for (int64_t i = 0; i < n; ++i) std::copy(bp, bp + out, yp + i * out);
  gemm(ctx, false, true, n, out, in, 1.0f, xp, in, wp, in, bp ? 1.0f : 0.0f, yp, out);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float* xp = x.f32();
  const float* wp = w.f32();
  const float* dyp = dy.f32();  // (N, out)
  // dx (N, in) = dy W, written (=).
  if (dx && ctx.math.split_invariant) {
    float* dxp = dx->f32();
    for (int64_t i = 0; i < n; ++i) {
      float* row = dxp + i * in;
      std::fill(row, row + in, 0.0f);
      for (int64_t o = 0; o < out; ++o) {
        const float a = dyp[i * out + o];
        const float* wr = wp + o * in;
        for (int64_t j = 0; j < in; ++j) row[j] += a * wr[j];
      }
    }
  } else if (dx) {
    gemm(ctx, false, false, n, in, out, 1.0f, dyp, out, wp, in, 0.0f, dx->f32(), in);
  }
  if (dw.dtype() == DType::F64) {
    // Each sample's contribution is a float product, summed in double: exact
    // unless the terms span more than ~29 binary orders of magnitude, so the
    // result does not depend on how the rows are split or ordered.
    double* dwp = dw.f64();
    double* dbp = db ? db->f64() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = xp + i * in;
      for (int64_t o = 0; o < out; ++o) {
        const float a = dyp[i * out + o];
        double* wr = dwp + o * in;
        for (int64_t j = 0; j < in; ++j) wr[j] += static_cast<double>(a * xr[j]);
        if (dbp) dbp[o] += a;
      }
    }
    return;
  }
  // dw (out, in) += dy^T x.
  gemm(ctx, true, false, out, in, n, 1.0f, dyp, out, xp, in, 1.0f, dw.f32(), in);
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
