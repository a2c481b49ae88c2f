// The row steps shared by the CPU convolutions (conv2d.cpp's im2col/col2im,
// conv3d.cpp's vol2col/col2vol): along the last axis, output column ow of
// kernel column kw reads input column iw = ow * stride - pad + kw.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace fanout::kernels::cpu::conv_rows {

// Ceil of a / s for s > 0, clamped to [0, hi].
inline int64_t ceil_div_clamp(int64_t a, int64_t s, int64_t hi) {
  if (a <= 0) return 0;
  return std::min(hi, (a + s - 1) / s);
}

// The output columns [lo, hi) of kernel column kw whose input column lies in [0, w).
inline void valid_cols(int64_t w, int64_t ow, int64_t stride, int64_t pad, int64_t kw, int64_t& lo, int64_t& hi) {
  lo = ceil_div_clamp(pad - kw, stride, ow);
  hi = std::max(lo, ceil_div_clamp(w + pad - kw, stride, ow));
}

// dst[0, ow) = in[iw0 + (j - lo) * stride] for j in [lo, hi), 0 elsewhere;
// in is the input row, iw0 the input column of output column lo.
inline void gather_row(float* dst, const float* in, int64_t iw0, int64_t lo, int64_t hi, int64_t ow,
                       int64_t stride) {
  std::fill(dst, dst + lo, 0.0f);
  if (hi > lo) {
    const float* src = in + iw0;
    if (stride == 1) {
      std::memcpy(dst + lo, src, sizeof(float) * (hi - lo));
    } else {
      float* out = dst + lo;
      for (int64_t j = 0; j < hi - lo; ++j) out[j] = src[j * stride];
    }
  }
  std::fill(dst + hi, dst + ow, 0.0f);
}

// dst[j * stride] += src[j] for j in [0, len): gather_row's adjoint.
inline void scatter_add_row(float* dst, const float* src, int64_t len, int64_t stride) {
  if (stride == 1) {
    for (int64_t j = 0; j < len; ++j) dst[j] += src[j];
  } else {
    for (int64_t j = 0; j < len; ++j) dst[j * stride] += src[j];
  }
}

}  // namespace fanout::kernels::cpu::conv_rows
