// CPU 2-D convolution: im2col + one GEMM per image (OpenBLAS), col2im for dx.
// The column buffer lives in the context's workspace, so a warmed-up step
// allocates nothing. A 1x1 kernel with stride 1 and no padding skips im2col:
// the image itself is the column matrix.
#include "kernels/conv2d.h"

#include <algorithm>
#include <cstring>

#include "kernels/gemm.h"
#include "kernels/cpu/conv_rows.h"
#include "kernels/cpu/loops.h"

namespace fanout::kernels::cpu {

namespace {

struct Dims {
  int64_t n, c, h, w;      // input
  int64_t oc, kh, kw;      // kernel
  int64_t oh, ow;          // output
  int64_t stride, pad;
  int64_t ckk() const { return c * kh * kw; }
  int64_t ohw() const { return oh * ow; }
  bool direct() const { return kh == 1 && kw == 1 && stride == 1 && pad == 0; }
};

Dims dims_of(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dGeometry& g) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), w.size(0), w.size(2), w.size(3),
          y.size(2), y.size(3), g.stride, g.padding};
}

// For kernel column kw: output columns [lo, hi) read input columns inside [0, W).
inline void valid_cols(const Dims& d, int64_t kw, int64_t& lo, int64_t& hi) {
  conv_rows::valid_cols(d.w, d.ow, d.stride, d.pad, kw, lo, hi);
}

// Stride 1 with OW == W (e.g. 3x3 padding 1): a kernel offset (kh, kw) maps
// output index i = oh*OW + ow to input index i + off, so each column-matrix
// row is one contiguous copy of the plane; the columns that wrapped around a
// row edge (they belong to the padding) are then fixed up one by one.
struct Shift {
  int64_t off;           // input index - output index
  int64_t lo, hi;        // valid output columns [lo, hi)
  int64_t begin, end;    // valid output range [begin, end) in the flattened OH*OW (may contain wrapped columns)
  int64_t oh_lo, oh_hi;  // valid output rows
};
inline bool shift_layout(const Dims& d) { return d.stride == 1 && d.ow == d.w; }
inline Shift shift_of(const Dims& d, int64_t kh, int64_t kw) {
  Shift s;
  s.off = (kh - d.pad) * d.w + (kw - d.pad);
  valid_cols(d, kw, s.lo, s.hi);
  s.oh_lo = std::clamp<int64_t>(d.pad - kh, 0, d.oh);
  s.oh_hi = std::clamp<int64_t>(d.h + d.pad - kh, s.oh_lo, d.oh);
  if (s.oh_hi > s.oh_lo && s.hi > s.lo) {
    s.begin = s.oh_lo * d.ow + s.lo;
    s.end = (s.oh_hi - 1) * d.ow + s.hi;
  } else {
    s.begin = s.end = 0;
  }
  return s;
}
// Zeroes the wrapped columns of valid rows: [0, lo) and [hi, OW) of rows [oh_lo, oh_hi).
inline void zero_wrapped(const Dims& d, const Shift& s, float* row) {
  for (int64_t oh = s.oh_lo; oh < s.oh_hi; ++oh) {
    float* r = row + oh * d.ow;
    for (int64_t j = 0; j < s.lo; ++j) r[j] = 0.0f;
    for (int64_t j = s.hi; j < d.ow; ++j) r[j] = 0.0f;
  }
}

void im2col_shift(const Dims& d, const float* x, float* col) {
  const int64_t ohw = d.ohw();
  for (int64_t c = 0; c < d.c; ++c) {
    const float* xc = x + c * d.h * d.w;
    for (int64_t kh = 0; kh < d.kh; ++kh)
      for (int64_t kw = 0; kw < d.kw; ++kw) {
        float* row = col + ((c * d.kh + kh) * d.kw + kw) * ohw;
        const Shift s = shift_of(d, kh, kw);
        std::memset(row, 0, sizeof(float) * s.begin);
        if (s.end > s.begin) std::memcpy(row + s.begin, xc + s.begin + s.off, sizeof(float) * (s.end - s.begin));
        std::memset(row + s.end, 0, sizeof(float) * (ohw - s.end));
        zero_wrapped(d, s, row);
      }
  }
}

// dcol is scratch: its wrapped (padding) columns are zeroed in place first.
void col2im_shift(const Dims& d, float* col, float* dx) {
  const int64_t ohw = d.ohw();
  for (int64_t c = 0; c < d.c; ++c) {
    float* dxc = dx + c * d.h * d.w;
    for (int64_t kh = 0; kh < d.kh; ++kh)
      for (int64_t kw = 0; kw < d.kw; ++kw) {
        float* row = col + ((c * d.kh + kh) * d.kw + kw) * ohw;
        const Shift s = shift_of(d, kh, kw);
        zero_wrapped(d, s, row);
        const int64_t off = s.off;
        for (int64_t i = s.begin; i < s.end; ++i) dxc[i + off] += row[i];
      }
  }
}

// x (C, H, W) -> col (C*KH*KW, OH*OW), written (=). Padding reads as zero.
void im2col(const Dims& d, const float* x, float* col) {
  if (shift_layout(d)) return im2col_shift(d, x, col);
  const int64_t ohw = d.ohw();
  for (int64_t c = 0; c < d.c; ++c) {
    const float* xc = x + c * d.h * d.w;
    for (int64_t kh = 0; kh < d.kh; ++kh) {
      for (int64_t kw = 0; kw < d.kw; ++kw) {
        float* row = col + ((c * d.kh + kh) * d.kw + kw) * ohw;
        int64_t lo, hi;
        valid_cols(d, kw, lo, hi);
        const int64_t iw0 = lo * d.stride - d.pad + kw;  // input column of output column lo
        for (int64_t oh = 0; oh < d.oh; ++oh) {
          float* dst = row + oh * d.ow;
          const int64_t ih = oh * d.stride - d.pad + kh;
          if (ih < 0 || ih >= d.h) {
            std::memset(dst, 0, sizeof(float) * d.ow);
            continue;
          }
          conv_rows::gather_row(dst, xc + ih * d.w, iw0, lo, hi, d.ow, d.stride);
        }
      }
    }
  }
}

// col (C*KH*KW, OH*OW) -> dx (C, H, W), accumulated (+=); padding is dropped.
// col is scratch and may be modified.
void col2im(const Dims& d, float* col, float* dx) {
  if (shift_layout(d)) return col2im_shift(d, col, dx);
  const int64_t ohw = d.ohw();
  for (int64_t c = 0; c < d.c; ++c) {
    float* dxc = dx + c * d.h * d.w;
    for (int64_t kh = 0; kh < d.kh; ++kh) {
      for (int64_t kw = 0; kw < d.kw; ++kw) {
        const float* row = col + ((c * d.kh + kh) * d.kw + kw) * ohw;
        int64_t lo, hi;
        valid_cols(d, kw, lo, hi);
        const int64_t iw0 = lo * d.stride - d.pad + kw;
        for (int64_t oh = 0; oh < d.oh; ++oh) {
          const int64_t ih = oh * d.stride - d.pad + kh;
          if (ih < 0 || ih >= d.h || hi == lo) continue;
          conv_rows::scatter_add_row(dxc + ih * d.w + iw0, row + oh * d.ow + lo, hi - lo, d.stride);
        }
      }
    }
  }
}

}  // namespace

void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dGeometry& g,
                    Tensor& y) {
  const Dims d = dims_of(x, w, y, g);
  const int64_t ckk = d.ckk(), ohw = d.ohw(), chw = d.c * d.h * d.w;
  if (d.n == 0 || ohw == 0) return;
  float* col = d.direct() ? nullptr : static_cast<float*>(ctx.workspace(sizeof(float) * ckk * ohw));
  const float* xp = x.f32();  // (N, C, H, W)
  const float* wp = w.f32();  // (OC, C*KH*KW)
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();  // (N, OC, OH*OW)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = xp + n * chw;
    float* yn = yp + n * d.oc * ohw;
    if (!d.direct()) im2col(d, xn, col);
    if (bp)
      for (int64_t o = 0; o < d.oc; ++o) std::fill(yn + o * ohw, yn + (o + 1) * ohw, bp[o]);
    // y_n (OC, OHW) = W (OC, CKK) col (CKK, OHW) [+ bias already in y_n].
    gemm(ctx, false, false, d.oc, ohw, ckk, 1.0f, wp, ckk, d.direct() ? xn : col, ohw, bp ? 1.0f : 0.0f, yn, ohw);
  }
}

void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db) {
  const Dims d = dims_of(x, w, dy, g);
  const int64_t ckk = d.ckk(), ohw = d.ohw(), chw = d.c * d.h * d.w;
  if (dx && !d.direct()) dx->zero();  // col2im accumulates; inputs no window reads keep 0
  if (d.n == 0 || ohw == 0) return;
  // float64 gradients: each image's float dW goes to a scratch matrix first,
  // then is added in double, so the sum does not depend on the image order.
  const bool want_dw = dw.defined();
  const bool exact = want_dw && dw.dtype() == DType::F64;
  const int64_t col_floats = d.direct() ? 0 : ckk * ohw;
  float* scratch =
      static_cast<float*>(ctx.workspace(sizeof(float) * (col_floats + (exact ? d.oc * ckk : 0))));
  float* col = d.direct() ? nullptr : scratch;
  float* dw_img = exact ? scratch + col_floats : nullptr;
  const float* xp = x.f32();
  const float* wp = w.f32();    // (OC, CKK)
  const float* dyp = dy.f32();  // (N, OC, OHW)
  float* dwp = want_dw && !exact ? dw.f32() : nullptr;  // (OC, CKK), +=
  double* dwp64 = exact ? dw.f64() : nullptr;
  float* dbp = db && !exact ? db->f32() : nullptr;
  double* dbp64 = db && exact ? db->f64() : nullptr;
  float* dxp = dx ? dx->f32() : nullptr;
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = xp + n * chw;
    const float* dyn = dyp + n * d.oc * ohw;
    // dW (OC, CKK) += dy_n (OC, OHW) col^T (OHW, CKK).
    if (want_dw) {
      const float* cn = xn;
      if (!d.direct()) {
        im2col(d, xn, col);
        cn = col;
      }
      if (exact) {
        gemm(ctx, false, true, d.oc, ckk, ohw, 1.0f, dyn, ohw, cn, ohw, 0.0f, dw_img, ckk);
        for (int64_t i = 0; i < d.oc * ckk; ++i) dwp64[i] += dw_img[i];
      } else {
        gemm(ctx, false, true, d.oc, ckk, ohw, 1.0f, dyn, ohw, cn, ohw, 1.0f, dwp, ckk);
      }
    }
    if (dbp)
      for (int64_t o = 0; o < d.oc; ++o) dbp[o] += sum_f32(dyn + o * ohw, ohw);
    if (dbp64)
      for (int64_t o = 0; o < d.oc; ++o) dbp64[o] += sum_f32(dyn + o * ohw, ohw);
    if (dxp) {
      float* dxn = dxp + n * chw;
      if (d.direct()) {
        // dx_n (C, HW) = W^T (C, OC) dy_n (OC, HW), written.
        gemm(ctx, true, false, ckk, ohw, d.oc, 1.0f, wp, ckk, dyn, ohw, 0.0f, dxn, ohw);
      } else {
        // dcol (CKK, OHW) = W^T dy_n, reusing the column buffer; then scatter-add into dx_n (zeroed above).
        gemm(ctx, true, false, ckk, ohw, d.oc, 1.0f, wp, ckk, dyn, ohw, 0.0f, col, ohw);
        col2im(d, col, dxn);
      }
    }
  }
}

}  // namespace fanout::kernels::cpu
