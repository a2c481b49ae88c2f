// CPU fully connected layer: GEMMs (oneDNN's matmul), or, with
// math.split_invariant, loops whose per-row summation order does not depend
// on the number of rows (a GEMM library's does) and exact float64 weight
// gradients. Under autocast, where oneDNN multiplies the low type natively
// (kernels/cpu/gemm_low.h), the products run in it as cuBLAS runs them:
// operands rounded as they are read, float32 accumulation, results rounded
// once (kernels::linear_rounds_in_low_type).
#include "kernels/linear.h"

#include <algorithm>
#include <cstring>

#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/cpu/gemm_low.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/storage.h"

// The loops marked FANOUT_AVX2_CLONE keep explicit partial sums (loops.h).
namespace fanout::kernels::cpu {

namespace {

constexpr int kRows = 4;  // rows (or weight rows) sharing each load; rows_forward unrolls 4

// y[i][o] = b[o] + dot_f32(x[i], w[o]) for every row, kRows rows at a time.
// Lane l of each accumulator is dot_f32's partial sum l, combined in its
// order, so a row's value is the same in a block or alone.
typedef float v8f __attribute__((vector_size(32)));

FANOUT_AVX2_CLONE void rows_forward(const float* x, const float* w, const float* b, float* y, int64_t n, int64_t in,
                                    int64_t out) {
  int64_t i = 0;
  for (; i + kRows <= n; i += kRows)
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      v8f acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
      int64_t j = 0;
      for (; j + 8 <= in; j += 8) {
        v8f wv, x0, x1, x2, x3;  // unaligned loads
        std::memcpy(&wv, wr + j, sizeof wv);
        std::memcpy(&x0, x + i * in + j, sizeof x0);
        std::memcpy(&x1, x + (i + 1) * in + j, sizeof x1);
        std::memcpy(&x2, x + (i + 2) * in + j, sizeof x2);
        std::memcpy(&x3, x + (i + 3) * in + j, sizeof x3);
        acc0 += x0 * wv;
        acc1 += x1 * wv;
        acc2 += x2 * wv;
        acc3 += x3 * wv;
      }
      const v8f accs[kRows] = {acc0, acc1, acc2, acc3};
      for (int r = 0; r < kRows; ++r) {
        const v8f& a = accs[r];
        float s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
        for (int64_t t = j; t < in; ++t) s += x[(i + r) * in + t] * wr[t];
        y[(i + r) * out + o] = (b ? b[o] : 0.0f) + s;
      }
    }
  for (; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) y[i * out + o] = (b ? b[o] : 0.0f) + dot_f32(x + i * in, w + o * in, in);
}

// dx[i] = sum over o, ascending, of dy[i][o] * w[o]: the same order per row in
// a block or alone.
FANOUT_AVX2_CLONE void rows_input_grad(const float* dy, const float* w, float* dx, int64_t n, int64_t in,
                                       int64_t out) {
  std::fill(dx, dx + n * in, 0.0f);
  int64_t i = 0;
  for (; i + kRows <= n; i += kRows)  // each w element loaded once for kRows rows
    for (int64_t o = 0; o < out; ++o) {
      const float* wr = w + o * in;
      float a[kRows];
      for (int r = 0; r < kRows; ++r) a[r] = dy[(i + r) * out + o];
      for (int64_t j = 0; j < in; ++j) {
        const float v = wr[j];
        for (int r = 0; r < kRows; ++r) dx[(i + r) * in + j] += a[r] * v;
      }
    }
  for (; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      const float a = dy[i * out + o];
      const float* wr = w + o * in;
      float* row = dx + i * in;
      for (int64_t j = 0; j < in; ++j) row[j] += a * wr[j];
    }
}

// dw[o][j] += (double)(dy[i][o] * x[i][j]) over the rows: each sample's
// contribution is a float product, summed in double. A double holds the sum
// of floats exactly unless the terms span more than ~29 binary orders of
// magnitude, so the result does not depend on how rows are split or ordered.
// Zero products (ReLU-masked rows) are skipped: adding +-0 changes no sum.
FANOUT_AVX2_CLONE void weight_grad_f64(const float* dy, const float* x, double* dw, double* db, int64_t n,
                                       int64_t in, int64_t out) {
  for (int64_t o0 = 0; o0 < out; o0 += kRows) {
    const int64_t o1 = std::min(out, o0 + kRows);
    for (int64_t i = 0; i < n; ++i) {
      const float* xr = x + i * in;  // read once per block of weight rows
      for (int64_t o = o0; o < o1; ++o) {
        const float a = dy[i * out + o];
        if (a == 0.0f) continue;
        double* wr = dw + o * in;
        for (int64_t j = 0; j < in; ++j) wr[j] += static_cast<double>(a * xr[j]);
      }
    }
  }
  if (db)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < out; ++k) db[k] += dy[i * out + k];
}

// Staging roles of the low-type products (the entry point stages in 0 to 2).
enum LowRole { kLowX = 3, kLowW, kLowDy, kLowTerm };

// t's values in the low type lt: t itself when stored in it, else rounded
// into staging role `role`.
const void* low_operand(Context& ctx, const Tensor& t, DType lt, int role) {
  if (t.dtype() == lt) return t.raw();
  Tensor s = ctx.staging(role, static_cast<size_t>(t.numel()) * dtype_size(lt)).as(t.shape(), lt);
  convert(ctx, t, s);
  return s.raw();
}

// acc (float32 or float64) += widen(term), term of type lt.
void add_widened(const Context& ctx, const Tensor& term, DType lt, Tensor& acc) {
  const char* tp = static_cast<const char*>(term.raw());
  const size_t es = dtype_size(lt);
  float_runs(ctx, acc.numel(), [&](int64_t i, int64_t k) {
    float buf[kRun];
    widen_span(lt, tp + i * es, buf, k);
    if (acc.dtype() == DType::F64) {
      double* a = acc.f64() + i;
      for (int64_t j = 0; j < k; ++j) a[j] += buf[j];
    } else {
      float* a = acc.f32() + i;
      for (int64_t j = 0; j < k; ++j) a[j] += buf[j];
    }
  });
}

// db (float32 or float64) += the columns of dy (n, out) in dy's storage,
// row after row into db itself (the float32 path's order and bits).
void column_sums(const Tensor& dy, Tensor& db) {
  const int64_t n = dy.size(0), out = dy.size(1);
  const DType t = dy.dtype();
  const char* dp = static_cast<const char*>(dy.raw());
  const size_t es = dtype_size(t);
  for (int64_t c0 = 0; c0 < out; c0 += kRun) {
    const int64_t k = std::min<int64_t>(kRun, out - c0);
    float buf[kRun];
    for (int64_t i = 0; i < n; ++i) {
      widen_span(t, dp + (i * out + c0) * es, buf, k);
      if (db.dtype() == DType::F64) {
        for (int64_t j = 0; j < k; ++j) db.f64()[c0 + j] += buf[j];
      } else {
        float* d = db.f32() + c0;
        for (int64_t j = 0; j < k; ++j) d[j] += buf[j];
      }
    }
  }
}

void low_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const DType lt = ctx.math.autocast;
  const void* xl = low_operand(ctx, x, lt, kLowX);
  const void* wl = low_operand(ctx, w, lt, kLowW);
  gemm_low(ctx, false, true, n, out, in, lt, xl, in, wl, in, b ? b->f32() : nullptr, false, y.raw(), y.dtype(), out);
  if (y.dtype() == DType::F32) round_to(ctx, y, lt);
}

void low_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                  Tensor* db) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const DType lt = ctx.math.autocast;
  const void* dyl = low_operand(ctx, dy, lt, kLowDy);
  if (dx) {  // dx (N, in) = dy W, rounded
    gemm_low(ctx, false, false, n, in, out, lt, dyl, out, low_operand(ctx, w, lt, kLowW), in, nullptr, false,
             dx->raw(), dx->dtype(), in);
    if (dx->dtype() == DType::F32) round_to(ctx, *dx, lt);
  }
  if (n == 0) return;  // no rows: nothing to add
  // dw (out, in) += dy^T x, the term rounded to the low type first.
  Tensor term = ctx.staging(kLowTerm, static_cast<size_t>(out * in) * dtype_size(lt)).as(w.shape(), lt);
  gemm_low(ctx, true, false, out, in, n, lt, dyl, out, low_operand(ctx, x, lt, kLowX), in, nullptr, false, term.raw(),
           lt, in);
  add_widened(ctx, term, lt, dw);
  if (db) column_sums(dy, *db);
}

}  // namespace

bool linear_rounds_in_low_type(const Context& ctx) {
  return ctx.math.autocast != DType::F32 && !ctx.math.split_invariant && low_gemm_native(ctx.math.autocast);
}

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  if (linear_rounds_in_low_type(ctx)) return low_forward(ctx, x, w, b, y);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();  // (N, out)
  if (ctx.math.split_invariant) return rows_forward(x.f32(), w.f32(), bp, yp, n, in, out);
  // y = b broadcast over rows, then y += x W^T.
  if (bp)
    for (int64_t i = 0; i < n; ++i) std::copy(bp, bp + out, yp + i * out);
  gemm(ctx, false, true, n, out, in, 1.0f, x.f32(), in, w.f32(), in, bp ? 1.0f : 0.0f, yp, out);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  if (linear_rounds_in_low_type(ctx)) return low_backward(ctx, x, w, dy, dx, dw, db);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float* dyp = dy.f32();  // (N, out)
  // dx (N, in) = dy W, written (=).
  if (dx && ctx.math.split_invariant) rows_input_grad(dyp, w.f32(), dx->f32(), n, in, out);
  else if (dx) gemm(ctx, false, false, n, in, out, 1.0f, dyp, out, w.f32(), in, 0.0f, dx->f32(), in);
  if (dw.dtype() == DType::F64)
    return weight_grad_f64(dyp, x.f32(), dw.f64(), db ? db->f64() : nullptr, n, in, out);
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
