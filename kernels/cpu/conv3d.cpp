// CPU 3-D convolution: vol2col + GEMM per image (OpenBLAS), col2vol for dx,
// the 3-D form of kernels/cpu/conv2d.cpp. The column matrix of a whole volume
// grows with C * K^3 * OD * OH * OW, so an image is processed in slabs of
// output depth planes whose columns fit a fixed budget; the buffer lives in
// the context's workspace, so a warmed-up step allocates nothing. A 1x1x1
// kernel with stride 1 and no padding skips vol2col: the image itself is the
// column matrix.
#include "kernels/conv3d.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/conv_rows.h"
#include "kernels/cpu/loops.h"
#include "kernels/gemm.h"

namespace fanout::kernels::cpu {

namespace {

// Column-buffer budget per slab: 4 Mi floats (16 MiB).
constexpr int64_t kSlabFloats = int64_t{1} << 22;

struct Dims {
  int64_t n, c, d, h, w;   // input
  int64_t oc, kd, kh, kw;  // kernel
  int64_t od, oh, ow;      // output
  int64_t stride, pad;
  int64_t ck() const { return c * kd * kh * kw; }
  int64_t ohw() const { return oh * ow; }
  int64_t odhw() const { return od * oh * ow; }
  int64_t dhw() const { return d * h * w; }
  bool direct() const { return kd == 1 && kh == 1 && kw == 1 && stride == 1 && pad == 0; }
  // Output depth planes per slab: as many as the budget holds, at least one.
  int64_t slab() const {
    if (direct()) return od;
    return std::clamp<int64_t>(kSlabFloats / std::max<int64_t>(1, ck() * ohw()), 1, od);
  }
};

Dims dims_of(const Tensor& x, const Tensor& w, const Tensor& y, const Conv3dGeometry& g) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), x.size(4), w.size(0), w.size(2), w.size(3), w.size(4),
          y.size(2), y.size(3), y.size(4), g.stride, g.padding};
}

// For kernel column kw: output columns [lo, hi) read input columns inside [0, W).
inline void valid_cols(const Dims& d, int64_t kw, int64_t& lo, int64_t& hi) {
  conv_rows::valid_cols(d.w, d.ow, d.stride, d.pad, kw, lo, hi);
}

// Calls f(row, xc, kd, kh, kw) for every row of a column matrix of `cols`
// columns: row is the row of input channel c and kernel offset (kd, kh, kw),
// xc that channel of x.
template <class Col, class X, class F>
inline void for_each_row(const Dims& d, Col* col, int64_t cols, X* x, F f) {
  for (int64_t c = 0; c < d.c; ++c) {
    X* xc = x + c * d.dhw();
    for (int64_t kd = 0; kd < d.kd; ++kd)
      for (int64_t kh = 0; kh < d.kh; ++kh)
        for (int64_t kw = 0; kw < d.kw; ++kw)
          f(col + (((c * d.kd + kd) * d.kh + kh) * d.kw + kw) * cols, xc, kd, kh, kw);
  }
}

// x (C, D, H, W) -> col (C*KD*KH*KW, nd*OH*OW) for output planes [od0, od0 + nd), written (=).
// Padding reads as zero.
void vol2col(const Dims& d, const float* x, int64_t od0, int64_t nd, float* col) {
  const int64_t cols = nd * d.ohw();
  for_each_row(d, col, cols, x, [&](float* row, const float* xc, int64_t kd, int64_t kh, int64_t kw) {
    int64_t lo, hi;
    valid_cols(d, kw, lo, hi);
    const int64_t iw0 = lo * d.stride - d.pad + kw;  // input column of output column lo
    for (int64_t i = 0; i < nd; ++i) {
      float* plane = row + i * d.ohw();
      const int64_t id = (od0 + i) * d.stride - d.pad + kd;
      if (id < 0 || id >= d.d) {
        std::memset(plane, 0, sizeof(float) * d.ohw());
        continue;
      }
      const float* xd = xc + id * d.h * d.w;
      for (int64_t oh = 0; oh < d.oh; ++oh) {
        float* dst = plane + oh * d.ow;
        const int64_t ih = oh * d.stride - d.pad + kh;
        if (ih < 0 || ih >= d.h) {
          std::memset(dst, 0, sizeof(float) * d.ow);
          continue;
        }
        conv_rows::gather_row(dst, xd + ih * d.w, iw0, lo, hi, d.ow, d.stride);
      }
    }
  });
}

// col (C*KD*KH*KW, nd*OH*OW) of output planes [od0, od0 + nd) -> dx (C, D, H, W),
// accumulated (+=); padding is dropped.
void col2vol(const Dims& d, const float* col, int64_t od0, int64_t nd, float* dx) {
  const int64_t cols = nd * d.ohw();
  for_each_row(d, col, cols, dx, [&](const float* row, float* dxc, int64_t kd, int64_t kh, int64_t kw) {
    int64_t lo, hi;
    valid_cols(d, kw, lo, hi);
    if (hi == lo) return;
    const int64_t iw0 = lo * d.stride - d.pad + kw;
    const int64_t len = hi - lo;
    for (int64_t i = 0; i < nd; ++i) {
      const int64_t id = (od0 + i) * d.stride - d.pad + kd;
      if (id < 0 || id >= d.d) continue;
      const float* plane = row + i * d.ohw();
      float* dxd = dxc + id * d.h * d.w;
      for (int64_t oh = 0; oh < d.oh; ++oh) {
        const int64_t ih = oh * d.stride - d.pad + kh;
        if (ih < 0 || ih >= d.h) continue;
        conv_rows::scatter_add_row(dxd + ih * d.w + iw0, plane + oh * d.ow + lo, len, d.stride);
      }
    }
  });
}

}  // namespace

void conv3d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const Conv3dGeometry& g,
                    Tensor& y) {
  const Dims d = dims_of(x, w, y, g);
  const int64_t ck = d.ck(), odhw = d.odhw(), slab = d.slab();
  if (d.n == 0 || odhw == 0) return;
  float* col = d.direct() ? nullptr : static_cast<float*>(ctx.workspace(sizeof(float) * ck * slab * d.ohw()));
  const float* xp = x.f32();  // (N, C, D, H, W)
  const float* wp = w.f32();  // (OC, C*KD*KH*KW)
  const float* bp = b ? b->f32() : nullptr;
  float* yp = y.f32();  // (N, OC, OD*OH*OW)
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = xp + n * d.c * d.dhw();
    float* yn = yp + n * d.oc * odhw;
    if (bp)
      for (int64_t o = 0; o < d.oc; ++o) std::fill(yn + o * odhw, yn + (o + 1) * odhw, bp[o]);
    for (int64_t od0 = 0; od0 < d.od; od0 += slab) {
      const int64_t nd = std::min(slab, d.od - od0), cols = nd * d.ohw(), first = od0 * d.ohw();
      if (!d.direct()) vol2col(d, xn, od0, nd, col);
      // y_n[:, slab] (OC, cols) = W (OC, CK) col (CK, cols) [+ bias already in y_n].
      gemm(ctx, false, false, d.oc, cols, ck, 1.0f, wp, ck, d.direct() ? xn + first : col, d.direct() ? odhw : cols,
           bp ? 1.0f : 0.0f, yn + first, odhw);
    }
  }
}

void conv3d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const Conv3dGeometry& g,
                     Tensor* dx, Tensor& dw, Tensor* db) {
  const Dims d = dims_of(x, w, dy, g);
  const int64_t ck = d.ck(), odhw = d.odhw(), cdhw = d.c * d.dhw(), slab = d.slab();
  if (dx && !d.direct()) dx->zero();  // col2vol accumulates; inputs no window reads keep 0
  if (d.n == 0 || odhw == 0) return;
  // float64 gradients: each image's float dW goes to a scratch matrix first
  // (its slabs summed in a fixed order), then is added in double, so the sum
  // does not depend on the image order or on how the batch is split.
  const bool want_dw = dw.defined();
  const bool exact = want_dw && dw.dtype() == DType::F64;
  const int64_t col_floats = d.direct() ? 0 : ck * slab * d.ohw();
  float* scratch = static_cast<float*>(ctx.workspace(sizeof(float) * (col_floats + (exact ? d.oc * ck : 0))));
  float* col = d.direct() ? nullptr : scratch;
  float* dw_img = exact ? scratch + col_floats : nullptr;
  const float* xp = x.f32();
  const float* wp = w.f32();    // (OC, CK)
  const float* dyp = dy.f32();  // (N, OC, ODHW)
  float* dwp = want_dw && !exact ? dw.f32() : nullptr;  // (OC, CK), +=
  double* dwp64 = exact ? dw.f64() : nullptr;
  float* dbp = db && !exact ? db->f32() : nullptr;
  double* dbp64 = db && exact ? db->f64() : nullptr;
  float* dxp = dx ? dx->f32() : nullptr;
  for (int64_t n = 0; n < d.n; ++n) {
    const float* xn = xp + n * cdhw;
    const float* dyn = dyp + n * d.oc * odhw;
    float* dxn = dxp ? dxp + n * cdhw : nullptr;
    for (int64_t od0 = 0; od0 < d.od; od0 += slab) {
      const int64_t nd = std::min(slab, d.od - od0), cols = nd * d.ohw(), first = od0 * d.ohw();
      const float* dys = dyn + first;  // (OC, cols), row stride ODHW
      const float* cs = xn + first;    // direct: the image's columns, row stride ODHW
      int64_t ldc = odhw;
      if (want_dw && !d.direct()) {
        vol2col(d, xn, od0, nd, col);
        cs = col;
        ldc = cols;
      }
      // dW (OC, CK) += dy_slab (OC, cols) col^T (cols, CK).
      if (exact) {
        gemm(ctx, false, true, d.oc, ck, cols, 1.0f, dys, odhw, cs, ldc, od0 == 0 ? 0.0f : 1.0f, dw_img, ck);
      } else if (want_dw) {
        gemm(ctx, false, true, d.oc, ck, cols, 1.0f, dys, odhw, cs, ldc, 1.0f, dwp, ck);
      }
      if (dxn) {
        if (d.direct()) {
          // dx_n[:, slab] (C, cols) = W^T (C, OC) dy_slab (OC, cols), written.
          gemm(ctx, true, false, ck, cols, d.oc, 1.0f, wp, ck, dys, odhw, 0.0f, dxn + first, odhw);
        } else {
          // dcol (CK, cols) = W^T dy_slab, reusing the column buffer; then scatter-add into dx_n (zeroed above).
          gemm(ctx, true, false, ck, cols, d.oc, 1.0f, wp, ck, dys, odhw, 0.0f, col, cols);
          col2vol(d, col, od0, nd, dxn);
        }
      }
    }
    if (exact)
      for (int64_t i = 0; i < d.oc * ck; ++i) dwp64[i] += dw_img[i];
    if (dbp)
      for (int64_t o = 0; o < d.oc; ++o) dbp[o] += sum_f32(dyn + o * odhw, odhw);
    if (dbp64)
      for (int64_t o = 0; o < d.oc; ++o) dbp64[o] += sum_f32(dyn + o * odhw, odhw);
  }
}

}  // namespace fanout::kernels::cpu
