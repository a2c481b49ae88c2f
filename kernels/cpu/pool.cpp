// CPU pooling and upsampling, one contiguous (n, c) plane or volume at a
// time (threads take whole volumes); max pooling of channels-last storage
// (any floating type) on rows of channels, as stored (threads take images). A 2-D pooling runs as a 3-D one with
// depth 1 and a window of 1 along it. Windows are clipped to the volume, so
// padding is never selected by max pooling (it acts as -inf) and counts as
// zeros for average pooling (count_include_pad).
#include "kernels/pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"
#include "runtime/core/error.h"

namespace fanout::kernels::cpu {

namespace {

// Window [lo, hi) of output index o along axis a, clipped to the axis.
void window(int64_t o, const PoolAxes& ax, int a, int64_t& lo, int64_t& hi) {
  const int64_t start = o * ax.g[a].stride - ax.g[a].padding;
  lo = std::max<int64_t>(start, 0);
  hi = std::min<int64_t>(start + ax.g[a].kernel, ax.len[a]);
}

// Max-pool select step: take v when it is larger, or NaN (NaN propagates, as
// PyTorch's CPU kernel); a strict > keeps the first of equal maxima. Written
// branch-free: on real data a branch here mispredicts about half the time.
inline void take_max(float v, int32_t idx, float& best, int32_t& best_i) {
  const bool take = (v > best) | (v != v);
  best = take ? v : best;
  best_i = take ? idx : best_i;
}

// A window clipped to the volume: [d0, d1) x [h0, h1) x [w0, w1).
struct Box {
  int64_t d0, d1, h0, h1, w0, w1;
};

// f(v, o, box) for every output o of the volumes [v0, v1), in memory order.
// kDepth false: a 2-D pooling, whose one depth step the compiler then drops.
template <bool kDepth, class F>
void windows(const PoolAxes& ax, int64_t v0, int64_t v1, F& f) {
  for (int64_t v = v0; v < v1; ++v)
    for (int64_t i = 0; i < (kDepth ? ax.out[0] : 1); ++i) {
      Box box{0, 1, 0, 0, 0, 0};
      if constexpr (kDepth) window(i, ax, 0, box.d0, box.d1);
      for (int64_t j = 0; j < ax.out[1]; ++j) {
        window(j, ax, 1, box.h0, box.h1);
        for (int64_t k = 0; k < ax.out[2]; ++k) {
          window(k, ax, 2, box.w0, box.w1);
          f(v, (i * ax.out[1] + j) * ax.out[2] + k, box);
        }
      }
    }
}
template <class F>
void each_window(const PoolAxes& ax, int64_t v0, int64_t v1, F&& f) {
  if (ax.len[0] == 1 && ax.out[0] == 1) windows<false>(ax, v0, v1, f);
  else windows<true>(ax, v0, v1, f);
}

// f(start) for every row of the box, start the offset of the row's first
// element in its volume of rows of length w, h rows a plane.
template <class F>
void each_row(const Box& b, int64_t h, int64_t w, F&& f) {
  for (int64_t a = b.d0; a < b.d1; ++a)
    for (int64_t r = b.h0; r < b.h1; ++r) f((a * h + r) * w);
}

// The common 2x2 (x2) / stride 2 / no padding case: every window lies
// inside the volume. kDepth: 3-D windows over two planes of the volume.
//
// Output rows are short (14, 7 and 3 in cnn), and a vector loop's scalar
// remainder would take most of the time. A row is therefore computed kRowPad
// columns at a time, the extra columns running on into the next row's
// outputs (recomputed right when that row comes) and reading further along
// the input; a row does so only when both stay inside this call's volumes,
// so no other thread's outputs are touched and nothing past x is read.
constexpr int64_t kRowPad = 8;

template <bool kDepth>
void maxpool_2x2(const float* xp, int64_t vols, const PoolAxes& ax, float* yp, int32_t* ap) {
  const int64_t h = ax.len[1], w = ax.len[2], od = kDepth ? ax.out[0] : 1, oh = ax.out[1], ow = ax.out[2];
  const int64_t in = ax.in_volume(), out = ax.out_volume();
  const int64_t padded = (ow + kRowPad - 1) / kRowPad * kRowPad;
  // Elements a padded row reads past its window row's first (r0[0]), and the
  // end of what this call may read and write.
  const int64_t reach = (kDepth ? h * w + w : w) + 2 * padded;
  const int64_t in_end = vols * in, out_end = vols * out;
  // The extra columns' indices stay below in + reach: int32 where they may run.
  const bool may_run_on = in + reach <= std::numeric_limits<int32_t>::max();
  const int32_t wi = static_cast<int32_t>(w), plane = static_cast<int32_t>(h * w);
  for (int64_t p = 0; p < vols; ++p)
    for (int64_t d = 0; d < od; ++d)
      for (int64_t i = 0; i < oh; ++i) {
        const int64_t first = (2 * d * h + 2 * i) * w;  // the window row's first element in the volume
        const int64_t o = p * out + (d * oh + i) * ow;  // the row's first output
        const int64_t cols =
            may_run_on && o + padded <= out_end && p * in + first + reach <= in_end ? padded : ow;
        const float* r0 = xp + p * in + first;
        const float* r1 = r0 + w;
        const float* r2 = kDepth ? r0 + h * w : r0;  // the next plane
        const float* r3 = kDepth ? r2 + w : r1;
        const int32_t base = static_cast<int32_t>(first);
        float* yo = yp + o;
        int32_t* ao = ap + o;
        // 64-bit subscripts keep the loads affine, so g++ vectorizes this loop.
        for (int64_t j = 0; j < cols; ++j) {
          const int32_t c = base + static_cast<int32_t>(2 * j);
          float best = r0[2 * j];
          int32_t best_i = c;
          take_max(r0[2 * j + 1], c + 1, best, best_i);
          take_max(r1[2 * j], c + wi, best, best_i);
          take_max(r1[2 * j + 1], c + wi + 1, best, best_i);
          if constexpr (kDepth) {
            take_max(r2[2 * j], c + plane, best, best_i);
            take_max(r2[2 * j + 1], c + plane + 1, best, best_i);
            take_max(r3[2 * j], c + plane + wi, best, best_i);
            take_max(r3[2 * j + 1], c + plane + wi + 1, best, best_i);
          }
          yo[j] = best;
          ao[j] = best_i;
        }
      }
}
}  // namespace

namespace {

// f(img, buf) for every image of n, threads taking contiguous runs of
// images (at least `grain` each), each thread with its own `per` floats of
// the workspace in buf (null when per is 0).
template <class F>
void each_image(Context& ctx, int64_t n, int64_t grain, int64_t per, F&& f) {
  const int64_t slots = std::clamp<int64_t>(n / std::max<int64_t>(1, grain), 1, threads(ctx));
  float* ws = per ? static_cast<float*>(ctx.workspace(sizeof(float) * static_cast<size_t>(slots * per))) : nullptr;
  parallel_for(ctx, slots, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      for (int64_t img = n * s / slots; img < n * (s + 1) / slots; ++img) f(img, ws ? ws + s * per : nullptr);
  });
}

// Channels-last max pooling: x (N, D*H*W, C) rows, y (N, out, C), argmax
// (N, C, out) as the plane kernel writes it. Threads take images; a
// low-type image is widened once into float32 rows (in the thread's part of
// the workspace) and its outputs narrowed once (exact: they are stored values).
// Each output position takes its window's rows in (depth, row, column)
// order, every channel of a row at once: the plane kernel's selection per
// channel, in a loop over contiguous channels that vectorizes. Its argmax
// row is transposed into (C, out) when the image is done.
void rows_maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y,
                          Tensor& argmax) {
  const PoolAxes ax = pool_axes(spatial, x.shape(), y.shape(), g);
  const int64_t n = x.size(0), ch = x.size(1), h = ax.len[1], w = ax.len[2], in = ax.in_volume(),
                out = ax.out_volume();
  const DType t = x.dtype();
  const bool f32 = t == DType::F32;
  const size_t es = dtype_size(t);
  const char* xp = static_cast<const char*>(x.raw());
  char* yp = static_cast<char*>(y.raw());
  int32_t* ap = argmax.data<int32_t>();
  // A thread's buffer: an image's argmax rows (out, C), and for low types its widened x and y.
  const int64_t per = out * ch + (f32 ? 0 : in * ch + out * ch);
  each_image(ctx, n, grain_for(in * ch), per, [&](int64_t img, float* own) {
    int32_t* arows = reinterpret_cast<int32_t*>(own);
    const float* xi = f32 ? x.f32() + img * in * ch : own + out * ch;
    float* yi = f32 ? y.f32() + img * out * ch : own + out * ch + in * ch;
    if (!f32) widen_span(t, xp + img * in * ch * es, own + out * ch, in * ch);
    each_window(ax, img, img + 1, [&](int64_t, int64_t o, const Box& b) {
      float* best = yi + o * ch;
      int32_t* best_i = arows + o * ch;
      const int32_t first = static_cast<int32_t>((b.d0 * h + b.h0) * w + b.w0);
      for (int64_t c = 0; c < ch; ++c) {
        best[c] = -std::numeric_limits<float>::infinity();
        best_i[c] = first;
      }
      each_row(b, h, w, [&](int64_t row) {
        for (int64_t col = b.w0; col < b.w1; ++col) {
          const int32_t at = static_cast<int32_t>(row + col);  // the position in the image
          const float* v = xi + at * ch;
          for (int64_t c = 0; c < ch; ++c) take_max(v[c], at, best[c], best_i[c]);
        }
      });
    });
    int32_t* ai = ap + img * ch * out;
    for (int64_t c = 0; c < ch; ++c)
      for (int64_t o = 0; o < out; ++o) ai[c * out + o] = arows[o * ch + c];
    if (!f32) narrow_span(t, yi, yp + img * out * ch * es, out * ch);
  });
}

// dx (=) from dy through argmax, each image's values added in float32 in
// the order of its outputs (the plane kernel's), rounded once into dx. A
// low-type image's dy is widened once and its sums kept in the workspace.
void rows_maxpool_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const int64_t n = dx.size(0), ch = dx.size(1);
  if (n * ch == 0) return;
  const int64_t in = dx.numel() / (n * ch), out = dy.numel() / (n * ch);
  const DType t = dx.dtype(), gt = dy.dtype();
  const char* gp = static_cast<const char*>(dy.raw());
  char* dp = static_cast<char*>(dx.raw());
  const int32_t* ap = argmax.data<int32_t>();
  // A thread's buffer: an image's float32 sums for a low-type dx, its widened dy for a low-type dy.
  const int64_t sums = t == DType::F32 ? 0 : in * ch, per = sums + (gt == DType::F32 ? 0 : out * ch);
  each_image(ctx, n, grain_for(in * ch), per, [&](int64_t img, float* own) {
    float* d = sums ? own : dx.f32() + img * in * ch;
    const float* g = gt == DType::F32 ? dy.f32() + img * out * ch : own + sums;
    if (gt != DType::F32) widen_span(gt, gp + img * out * ch * dtype_size(gt), own + sums, out * ch);
    std::fill(d, d + in * ch, 0.0f);
    // Channel by channel, outputs in order: each element of d takes its terms in the order of the outputs.
    for (int64_t c = 0; c < ch; ++c) {
      const int32_t* a = ap + (img * ch + c) * out;
      for (int64_t o = 0; o < out; ++o) {
        FANOUT_CHECK(a[o] >= 0 && a[o] < in) << "maxpool_backward: argmax " << a[o] << " outside a volume of dx "
                                             << dx.shape().str();
        d[a[o] * ch + c] += g[o * ch + c];
      }
    }
    if (sums) narrow_span(t, d, dp + img * in * ch * dtype_size(t), in * ch);
  });
}

}  // namespace

void maxpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y,
                     Tensor& argmax) {
  if (x.channels_last()) return rows_maxpool_forward(ctx, spatial, x, g, y, argmax);
  const PoolAxes ax = pool_axes(spatial, x.shape(), y.shape(), g);
  const int64_t h = ax.len[1], w = ax.len[2], in = ax.in_volume(), out = ax.out_volume();
  // Windows of 2 at stride 2 without padding: none is clipped.
  const bool two_by_two = g.kernel == 2 && g.stride == 2 && g.padding == 0;
  const float* xp = x.f32();
  float* yp = y.f32();
  int32_t* ap = argmax.data<int32_t>();
  parallel_for(ctx, x.size(0) * x.size(1), grain_for(in), [&](int64_t v0, int64_t v1) {
    if (two_by_two) {
      if (spatial == 3) maxpool_2x2<true>(xp + v0 * in, v1 - v0, ax, yp + v0 * out, ap + v0 * out);
      else maxpool_2x2<false>(xp + v0 * in, v1 - v0, ax, yp + v0 * out, ap + v0 * out);
      return;
    }
    each_window(ax, v0, v1, [&](int64_t v, int64_t o, const Box& b) {
      const float* xs = xp + v * in;
      float best = -std::numeric_limits<float>::infinity();
      int32_t best_i = static_cast<int32_t>((b.d0 * h + b.h0) * w + b.w0);
      for (int64_t a = b.d0; a < b.d1; ++a)
        for (int64_t r = b.h0; r < b.h1; ++r) {
          const int64_t row = (a * h + r) * w;
          for (int64_t c = b.w0; c < b.w1; ++c) take_max(xs[row + c], static_cast<int32_t>(row + c), best, best_i);
        }
      yp[v * out + o] = best;
      ap[v * out + o] = best_i;
    });
  });
}

void maxpool_backward(Context& ctx, int, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  if (dx.channels_last()) return rows_maxpool_backward(ctx, dy, argmax, dx);
  const int64_t vols = dx.size(0) * dx.size(1);
  if (vols == 0) return;
  const int64_t in = dx.numel() / vols, out = dy.numel() / vols;
  const float* gp = dy.f32();
  const int32_t* ap = argmax.data<int32_t>();
  float* dp = dx.f32();
  parallel_for(ctx, vols, grain_for(in), [&](int64_t v0, int64_t v1) {
    std::fill(dp + v0 * in, dp + v1 * in, 0.0f);
    for (int64_t v = v0; v < v1; ++v) {
      const float* gs = gp + v * out;
      const int32_t* as = ap + v * out;
      float* ds = dp + v * in;
      for (int64_t i = 0; i < out; ++i) {
        const int64_t k = as[i];
        FANOUT_CHECK(k >= 0 && k < in) << "maxpool_backward: argmax " << k << " outside a volume of dx "
                                       << dx.shape().str();
        ds[k] += gs[i];
      }
    }
  });
}

namespace {
// Average pooling's two passes over the same windows, threads taking whole
// volumes. Forward (src x, dst y): each window's sum / kernel^rank.
// Backward (src dy, dst dx, zeroed first): each output's share spread over
// its window, so every input sums its shares in (depth, row, column) order of
// the outputs, the order the CUDA kernel gathers them in.
template <bool kBackward>
void avg_windows(Context& ctx, const PoolAxes& ax, int64_t vols, const float* src, float* dst) {
  const int64_t h = ax.len[1], w = ax.len[2], in = ax.in_volume(), out = ax.out_volume();
  // count_include_pad: in floor mode every window lies inside the padded volume.
  const float inv = 1.0f / static_cast<float>(ax.window_elements());
  parallel_for(ctx, vols, grain_for(in), [&](int64_t v0, int64_t v1) {
    if constexpr (kBackward) std::fill(dst + v0 * in, dst + v1 * in, 0.0f);
    each_window(ax, v0, v1, [&](int64_t v, int64_t o, const Box& b) {
      if constexpr (kBackward) {
        float* ds = dst + v * in;
        const float share = src[v * out + o] * inv;
        each_row(b, h, w, [&](int64_t row) {
          for (int64_t c = b.w0; c < b.w1; ++c) ds[row + c] += share;
        });
      } else {
        const float* xs = src + v * in;
        float sum = 0.0f;
        each_row(b, h, w, [&](int64_t row) {
          for (int64_t c = b.w0; c < b.w1; ++c) sum += xs[row + c];
        });
        dst[v * out + o] = sum * inv;
      }
    });
  });
}
}  // namespace

void avgpool_forward(Context& ctx, int spatial, const Tensor& x, const PoolGeometry& g, Tensor& y) {
  avg_windows<false>(ctx, pool_axes(spatial, x.shape(), y.shape(), g), x.size(0) * x.size(1), x.f32(), y.f32());
}

void avgpool_backward(Context& ctx, int spatial, const Tensor& dy, const PoolGeometry& g, Tensor& dx) {
  avg_windows<true>(ctx, pool_axes(spatial, dx.shape(), dy.shape(), g), dx.size(0) * dx.size(1), dy.f32(), dx.f32());
}

namespace {
// f(p) for every (sample, channel) plane p of `hw` values, the planes shared
// out over the context's threads.
template <class F>
void each_plane(Context& ctx, int64_t planes, int64_t hw, F&& f) {
  parallel_for(ctx, planes, grain_for(hw), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) f(p);
  });
}
}  // namespace

void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y) {
  const int64_t hw = x.size(2) * x.size(3);
  const float inv = 1.0f / static_cast<float>(hw);
  const float* xp = x.f32();
  float* yp = y.f32();
  each_plane(ctx, x.size(0) * x.size(1), hw, [&](int64_t p) { yp[p] = sum_f32(xp + p * hw, hw) * inv; });
}

void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx) {
  const int64_t hw = dx.size(2) * dx.size(3);
  const float* gp = dy.f32();
  float* dp = dx.f32();
  each_plane(ctx, dx.size(0) * dx.size(1), hw,
             [&](int64_t p) { std::fill(dp + p * hw, dp + (p + 1) * hw, gp[p] * (1.0f / static_cast<float>(hw))); });
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
