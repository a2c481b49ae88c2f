// CPU volumetric max pooling and nearest upsampling over (N, C, D, H, W), one
// contiguous volume at a time (threads take whole volumes). Max-pooling windows are clipped to the volume,
// so padding is never selected (it acts as -inf), as in kernels/cpu/pool.cpp.
#include "kernels/pool3d.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/pool_common.h"
#include "runtime/core/error.h"

namespace fanout::kernels::cpu {

namespace {
// A pooling window clipped to the volume: [d0, d1) x [h0, h1) x [w0, w1).
struct Box {
  int64_t d0, d1, h0, h1, w0, w1;
};

// f(v, o, box) for every output o of every (sample, channel) volume v of y,
// in memory order, the volumes shared out over the context's threads: the
// loop both 3-D poolings run.
template <class F>
void each_window(Context& ctx, const Shape& x, const Shape& y, const PoolGeometry& g, F&& f) {
  const int64_t vols = x[0] * x[1], od = y[2], oh = y[3], ow = y[4];
  parallel_for(ctx, vols, grain_for(x[2] * x[3] * x[4]), [&](int64_t v0, int64_t v1) {
  for (int64_t v = v0; v < v1; ++v)
    for (int64_t i = 0; i < od; ++i) {
      Box box;
      window(i, g, x[2], box.d0, box.d1);
      for (int64_t j = 0; j < oh; ++j) {
        window(j, g, x[3], box.h0, box.h1);
        for (int64_t k = 0; k < ow; ++k) {
          window(k, g, x[4], box.w0, box.w1);
          f(v, (i * oh + j) * ow + k, box);
        }
      }
    }
  });
}
}  // namespace

void maxpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax) {
  const int64_t h = x.size(3), w = x.size(4), dhw = x.size(2) * h * w, odhw = y.size(2) * y.size(3) * y.size(4);
  const float* xp = x.f32();
  float* yp = y.f32();
  int32_t* ap = argmax.data<int32_t>();
  each_window(ctx, x.shape(), y.shape(), g, [&](int64_t v, int64_t o, const Box& b) {
    const float* xs = xp + v * dhw;
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_i = static_cast<int32_t>((b.d0 * h + b.h0) * w + b.w0);
    for (int64_t a = b.d0; a < b.d1; ++a)
      for (int64_t r = b.h0; r < b.h1; ++r) {
        const int64_t row = (a * h + r) * w;
        for (int64_t c = b.w0; c < b.w1; ++c) take_max(xs[row + c], static_cast<int32_t>(row + c), best, best_i);
      }
    yp[v * odhw + o] = best;
    ap[v * odhw + o] = best_i;
  });
}

void avgpool3d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  const int64_t h = x.size(3), w = x.size(4), dhw = x.size(2) * h * w, odhw = y.size(2) * y.size(3) * y.size(4);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel * g.kernel);
  const float* xp = x.f32();
  float* yp = y.f32();
  each_window(ctx, x.shape(), y.shape(), g, [&](int64_t v, int64_t o, const Box& b) {
    const float* xs = xp + v * dhw;
    float s = 0.0f;
    for (int64_t a = b.d0; a < b.d1; ++a)
      for (int64_t r = b.h0; r < b.h1; ++r)
        for (int64_t c = b.w0; c < b.w1; ++c) s += xs[(a * h + r) * w + c];
    yp[v * odhw + o] = s * inv;
  });
}

void avgpool3d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  const int64_t vols = dx.size(0) * dx.size(1), d = dx.size(2), h = dx.size(3), w = dx.size(4);
  const int64_t od = dy.size(2), oh = dy.size(3), ow = dy.size(4);
  const float inv = 1.0f / static_cast<float>(g.kernel * g.kernel * g.kernel);
  const float* gp = dy.f32();
  float* dp = dx.f32();
  parallel_for(ctx, vols, grain_for(d * h * w), [&](int64_t v0, int64_t v1) {
  for (int64_t v = v0; v < v1; ++v) {
    const float* gs = gp + v * od * oh * ow;
    float* ds = dp + v * d * h * w;
    for (int64_t a = 0; a < d; ++a) {
      int64_t i0, i1;
      covering(a, g, od, i0, i1);
      for (int64_t b = 0; b < h; ++b) {
        int64_t j0, j1;
        covering(b, g, oh, j0, j1);
        for (int64_t c = 0; c < w; ++c) {
          int64_t k0, k1;
          covering(c, g, ow, k0, k1);
          float s = 0.0f;
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j)
              for (int64_t k = k0; k < k1; ++k) s += gs[(i * oh + j) * ow + k] * inv;
          ds[(a * h + b) * w + c] = s;
        }
      }
    }
  }
  });
}

void upsample3d_nearest_forward(Context& ctx, const Tensor& x, int64_t scale, Tensor& y) {
  const int64_t vols = x.size(0) * x.size(1), d = x.size(2), h = x.size(3), w = x.size(4);
  const int64_t s = scale, oh = h * s, ow = w * s, ohw = oh * ow;
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, vols, grain_for(d * s * ohw), [&](int64_t v0, int64_t v1) {
  for (int64_t v = v0; v < v1; ++v) {
    const float* xs = xp + v * d * h * w;
    float* ys = yp + v * d * s * ohw;
    for (int64_t i = 0; i < d; ++i) {
      float* plane = ys + i * s * ohw;  // output plane i*s; planes i*s+1 .. i*s+s-1 are copies
      for (int64_t j = 0; j < h; ++j) {
        const float* src = xs + (i * h + j) * w;
        float* row = plane + j * s * ow;  // output row j*s; rows j*s+1 .. j*s+s-1 are copies
        for (int64_t k = 0; k < w; ++k) std::fill(row + k * s, row + (k + 1) * s, src[k]);
        for (int64_t r = 1; r < s; ++r) std::memcpy(row + r * ow, row, sizeof(float) * ow);
      }
      for (int64_t r = 1; r < s; ++r) std::memcpy(plane + r * ohw, plane, sizeof(float) * ohw);
    }
  }
  });
}

void upsample3d_nearest_backward(Context& ctx, const Tensor& dy, int64_t scale, Tensor& dx) {
  const int64_t vols = dx.size(0) * dx.size(1), d = dx.size(2), h = dx.size(3), w = dx.size(4);
  const int64_t s = scale, oh = h * s, ow = w * s;
  const float* gp = dy.f32();
  float* dp = dx.f32();
  // Each input element sums its s^3 copies in the order (depth, row, column),
  // the order the CUDA kernel uses too.
  parallel_for(ctx, vols, grain_for(d * s * oh * ow), [&](int64_t v0, int64_t v1) {
  for (int64_t v = v0; v < v1; ++v) {
    const float* gs = gp + v * d * s * oh * ow;
    float* ds = dp + v * d * h * w;
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < h; ++j) {
        float* out = ds + (i * h + j) * w;
        std::fill(out, out + w, 0.0f);
        for (int64_t a = 0; a < s; ++a)
          for (int64_t b = 0; b < s; ++b) {
            const float* row = gs + ((i * s + a) * oh + j * s + b) * ow;
            for (int64_t k = 0; k < w; ++k)
              for (int64_t c = 0; c < s; ++c) out[k] += row[k * s + c];
          }
      }
  }
  });
}

}  // namespace fanout::kernels::cpu
