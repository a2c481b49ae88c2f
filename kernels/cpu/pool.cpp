// CPU pooling over (N, C, H, W), one contiguous plane at a time. Windows are
// clipped to the image, so padding is never selected by max pooling (it acts
// as -inf) and counts as zeros for average pooling (count_include_pad).
#include "kernels/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool_common.h"
#include "runtime/core/error.h"

namespace fanout::kernels::cpu {

namespace {

// The common 2x2 / stride 2 / no padding case: every window lies inside the image.
void maxpool_2x2(const float* xp, int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow, float* yp,
                 int32_t* ap) {
  const int32_t wi = static_cast<int32_t>(w);
  for (int64_t p = 0; p < planes; ++p) {
    const float* xs = xp + p * h * w;
    for (int64_t i = 0; i < oh; ++i) {
      const float* r0 = xs + 2 * i * w;
      const float* r1 = r0 + w;
      const int32_t base = static_cast<int32_t>(2 * i * w);
      float* yo = yp + (p * oh + i) * ow;
      int32_t* ao = ap + (p * oh + i) * ow;
      // 64-bit subscripts keep the loads affine, so g++ vectorizes this loop.
      for (int64_t j = 0; j < ow; ++j) {
        const int32_t c = base + static_cast<int32_t>(2 * j);
        float best = r0[2 * j];
        int32_t best_i = c;
        take_max(r0[2 * j + 1], c + 1, best, best_i);
        take_max(r1[2 * j], c + wi, best, best_i);
        take_max(r1[2 * j + 1], c + wi + 1, best, best_i);
        yo[j] = best;
        ao[j] = best_i;
      }
    }
  }
}

// Any geometry, planes [p0, p1): windows clipped to the image.
void maxpool_planes(const float* xp, int64_t p0, int64_t p1, const PoolGeometry& g, int64_t h, int64_t w,
                    int64_t oh, int64_t ow, float* yp, int32_t* ap) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* xs = xp + p * h * w;
    float* ys = yp + p * oh * ow;
    int32_t* as = ap + p * oh * ow;
    for (int64_t i = 0; i < oh; ++i) {
      int64_t h0, h1;
      window(i, g, h, h0, h1);
      for (int64_t j = 0; j < ow; ++j) {
        int64_t w0, w1;
        window(j, g, w, w0, w1);
        // Clipped window: padding is never a candidate. First maximum wins;
        // NaN propagates (as PyTorch's CPU kernel).
        float best = -std::numeric_limits<float>::infinity();
        int32_t best_i = static_cast<int32_t>(h0 * w + w0);
        for (int64_t r = h0; r < h1; ++r) {
          const float* row = xs + r * w;
          for (int64_t c = w0; c < w1; ++c) take_max(row[c], static_cast<int32_t>(r * w + c), best, best_i);
        }
        ys[i * ow + j] = best;
        as[i * ow + j] = best_i;
      }
    }
  }
}
}  // namespace

void maxpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = y.size(2), ow = y.size(3);
  const float* xp = x.f32();
  float* yp = y.f32();
  int32_t* ap = argmax.data<int32_t>();
  parallel_for(ctx, planes, grain_for(h * w), [&](int64_t p0, int64_t p1) {
    if (g.kernel == 2 && g.stride == 2 && g.padding == 0)
      maxpool_2x2(xp + p0 * h * w, p1 - p0, h, w, oh, ow, yp + p0 * oh * ow, ap + p0 * oh * ow);
    else
      maxpool_planes(xp, p0, p1, g, h, w, oh, ow, yp, ap);
  });
}

void maxpool2d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const int64_t planes = dy.size(0) * dy.size(1), ohw = dy.size(2) * dy.size(3);
  const int64_t hw = dx.size(2) * dx.size(3);
  const float* gp = dy.f32();
  const int32_t* ap = argmax.data<int32_t>();
  float* dp = dx.f32();
  parallel_for(ctx, planes, grain_for(hw), [&](int64_t p0, int64_t p1) {
    std::fill(dp + p0 * hw, dp + p1 * hw, 0.0f);
    for (int64_t p = p0; p < p1; ++p) {
      const float* gs = gp + p * ohw;
      const int32_t* as = ap + p * ohw;
      float* ds = dp + p * hw;
      for (int64_t i = 0; i < ohw; ++i) {
        const int64_t k = as[i];
        FANOUT_CHECK(k >= 0 && k < hw) << "maxpool2d_backward: argmax " << k << " outside a plane of dx "
                                       << dx.shape().str();
        ds[k] += gs[i];
      }
    }
  });
}

void avgpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = y.size(2), ow = y.size(3);
  // count_include_pad: in floor mode every window lies inside the padded image, so the divisor is kernel^2.
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, planes, grain_for(h * w), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* xs = xp + p * h * w;
      float* ys = yp + p * oh * ow;
      for (int64_t i = 0; i < oh; ++i) {
        int64_t h0, h1;
        window(i, g, h, h0, h1);
        for (int64_t j = 0; j < ow; ++j) {
          int64_t w0, w1;
          window(j, g, w, w0, w1);
          float s = 0.0f;
          for (int64_t r = h0; r < h1; ++r) {
            const float* row = xs + r * w;
            for (int64_t c = w0; c < w1; ++c) s += row[c];
          }
          ys[i * ow + j] = s * inv;
        }
      }
    }
  });
}

void avgpool2d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), h = dx.size(2), w = dx.size(3);
  const int64_t oh = dy.size(2), ow = dy.size(3);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel);
  const float* gp = dy.f32();
  float* dp = dx.f32();
  parallel_for(ctx, planes, grain_for(h * w), [&](int64_t p0, int64_t p1) {
    std::fill(dp + p0 * h * w, dp + p1 * h * w, 0.0f);
    for (int64_t p = p0; p < p1; ++p) {
      const float* gs = gp + p * oh * ow;
      float* ds = dp + p * h * w;
      for (int64_t i = 0; i < oh; ++i) {
        int64_t h0, h1;
        window(i, g, h, h0, h1);
        for (int64_t j = 0; j < ow; ++j) {
          int64_t w0, w1;
          window(j, g, w, w0, w1);
          const float v = gs[i * ow + j] * inv;
          for (int64_t r = h0; r < h1; ++r) {
            float* row = ds + r * w;
            for (int64_t c = w0; c < w1; ++c) row[c] += v;
          }
        }
      }
    }
  });
}

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  const float inv = 1.0f / static_cast<float>(hw);
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, planes, grain_for(hw), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) yp[p] = sum_f32(xp + p * hw, hw) * inv;
  });
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), hw = dx.size(2) * dx.size(3);
  const float inv = 1.0f / static_cast<float>(hw);
  const float* gp = dy.f32();
  float* dp = dx.f32();
  parallel_for(ctx, planes, grain_for(hw), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) std::fill(dp + p * hw, dp + (p + 1) * hw, gp[p] * inv);
  });
}

}  // namespace fanout::kernels::cpu
