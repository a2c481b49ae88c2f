// CPU batch normalization on channels-last rows (kernels/cpu/batchnorm_rows.h).
// A tensor is (R, C): R = N * spatial rows of C channels, each row contiguous.
// Reductions: threads take channel ranges and walk every row in order, each
// channel's float64 sums taken row after row (vectorized across channels),
// so the results do not depend on the thread count. Elementwise passes:
// threads take row ranges. Values move through float32 buffers of at most
// kRun channels (widened exactly, narrowed to nearest even).
#include "kernels/cpu/batchnorm_rows.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"
#include "runtime/core/half.h"

namespace fanout::kernels::cpu::rows {

namespace {

struct Rows {
  int64_t r, c;
};
Rows rows_of(const Tensor& x) {
  const int64_t c = x.size(1);
  return {c == 0 ? 0 : x.numel() / c, c};
}

// Channels [c0, c0 + k) of row r of t (R, C), widened into buf.
inline void load(const Tensor& t, int64_t r, int64_t c, int64_t c0, int64_t k, float* buf) {
  widen_short(t.dtype(), static_cast<const char*>(t.raw()) + (r * c + c0) * dtype_size(t.dtype()), buf, k);
}
// buf into channels [c0, c0 + k) of row r of t, rounded to t's type.
inline void store(Tensor& t, int64_t r, int64_t c, int64_t c0, int64_t k, const float* buf) {
  narrow_short(t.dtype(), buf, static_cast<char*>(t.raw()) + (r * c + c0) * dtype_size(t.dtype()), k);
}

// v rounded to T (F32: v itself), nearest even.
template <DType T>
inline float round_as(float v) {
  if constexpr (T == DType::BF16) return half::float_from_bf16(half::bf16_from_float(v));
  else if constexpr (T == DType::F16) return half::float_from_f16(half::f16_from_float(v));
  else return v;
}

// f(tag) with tag's type std::integral_constant<DType, t> for t F32, BF16 or
// F16: the passes' loops with their rounding fixed at compile time.
template <class F>
void with_round(DType t, F&& f) {
  if (t == DType::BF16) f(std::integral_constant<DType, DType::BF16>{});
  else if (t == DType::F16) f(std::integral_constant<DType, DType::F16>{});
  else f(std::integral_constant<DType, DType::F32>{});
}

// A block of channels' normalization constants: y = ((x - hi) - lo) * sc + b
// with sc = invstd * gamma, the mean as bn_finalize writes it (hi, lo).
struct Affine {
  float hi[kRun], lo[kRun], sc[kRun], b[kRun];
  Affine(const Tensor& mean, const Tensor& invstd, const Tensor& gamma, const Tensor& beta, int64_t c, int64_t c0,
         int64_t k) {
    const float *mp = mean.f32(), *ip = invstd.f32(), *gp = gamma.f32(), *bp = beta.f32();
    for (int64_t j = 0; j < k; ++j) {
      hi[j] = mp[c0 + j];
      lo[j] = mp[c + c0 + j];
      sc[j] = ip[c0 + j] * gp[c0 + j];
      b[j] = bp[c0 + j];
    }
  }
  float operator()(int64_t j, float v) const { return ((v - hi[j]) - lo[j]) * sc[j] + b[j]; }
};

// f(c0, k) over the channels in blocks of at most kRun, one range of them per
// thread (reductions: each block walks every row).
template <class F>
void channel_blocks(const Context& ctx, const Rows& p, F&& f) {
  parallel_for(ctx, p.c, grain_for(p.r), [&](int64_t b, int64_t e) {
    for (int64_t c0 = b; c0 < e; c0 += kRun) f(c0, std::min<int64_t>(kRun, e - c0));
  });
}

// f(c0, k, r0, r1) over channel blocks of every row range, one range of rows
// per thread (elementwise passes: per-channel constants once per block).
template <class F>
void row_blocks(const Context& ctx, const Rows& p, F&& f) {
  parallel_for(ctx, p.r, grain_for(p.c), [&](int64_t r0, int64_t r1) {
    for (int64_t c0 = 0; c0 < p.c; c0 += kRun) f(c0, std::min<int64_t>(kRun, p.c - c0), r0, r1);
  });
}

}  // namespace

void bn_stats(Context& ctx, const Tensor& x, Tensor& stats) {
  const Rows p = rows_of(x);
  double* sp = stats.f64();  // (3, C)
  if (p.r == 0) {
    std::fill(sp, sp + 3 * p.c, 0.0);
    return;
  }
  const double count = static_cast<double>(p.r);
  channel_blocks(ctx, p, [&](int64_t c0, int64_t k) {
    float buf[kRun];
    double pivot[kRun], s[kRun] = {}, q[kRun] = {};
    load(x, 0, p.c, c0, k, buf);  // pivots: each channel's first value, near its mean
    for (int64_t j = 0; j < k; ++j) pivot[j] = buf[j];
    for (int64_t r = 0; r < p.r; ++r) {
      load(x, r, p.c, c0, k, buf);
      for (int64_t j = 0; j < k; ++j) {
        const double v = buf[j] - pivot[j];  // exact
        s[j] += v;
        q[j] += v * v;
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      const double sum = s[j] + count * pivot[j];
      sp[c0 + j] = sum;
      sp[p.c + c0 + j] = std::max(0.0, q[j] - s[j] * s[j] / count);
      sp[2 * p.c + c0 + j] = sum * sum / count;
    }
  });
}

void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y) {
  const Rows p = rows_of(x);
  with_round(ctx.math.autocast, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
      const Affine f(mean, invstd, gamma, beta, p.c, c0, k);
      float buf[kRun];
      for (int64_t r = r0; r < r1; ++r) {
        load(x, r, p.c, c0, k, buf);
        for (int64_t j = 0; j < k; ++j) buf[j] = round_as<T>(f(j, buf[j]));
        store(y, r, p.c, c0, k, buf);
      }
    });
  });
}

void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round) {
  const Rows p = rows_of(x);
  with_round(round, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
      const Affine f(mean, invstd, gamma, beta, p.c, c0, k);
      float buf[kRun], zb[kRun];
      for (int64_t r = r0; r < r1; ++r) {
        load(x, r, p.c, c0, k, buf);
        // Rounded where the unfused layers store (F32: nothing between); NaN
        // propagates through the ReLU, as relu_forward.
        if (z) {
          load(*z, r, p.c, c0, k, zb);  // before y's row is written: y may alias z
          for (int64_t j = 0; j < k; ++j) {
            const float v = round_as<T>(round_as<T>(f(j, buf[j])) + zb[j]);
            buf[j] = v < 0.0f ? 0.0f : v;
          }
        } else {
          for (int64_t j = 0; j < k; ++j) {
            const float v = round_as<T>(f(j, buf[j]));
            buf[j] = v < 0.0f ? 0.0f : v;
          }
        }
        store(y, r, p.c, c0, k, buf);
      }
    });
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  const Rows p = rows_of(x);
  const float *mp = running_mean.f32(), *vp = running_var.f32(), *gp = gamma.f32(), *bp = beta.f32();
  with_round(ctx.math.autocast, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
      float m[kRun], sc[kRun], b[kRun], buf[kRun];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = c0 + j;
        m[j] = mp[c];
        sc[j] = static_cast<float>(gp[c] / std::sqrt(static_cast<double>(vp[c]) + static_cast<double>(eps)));
        b[j] = bp[c];
      }
      for (int64_t r = r0; r < r1; ++r) {
        load(x, r, p.c, c0, k, buf);
        for (int64_t j = 0; j < k; ++j) buf[j] = round_as<T>((buf[j] - m[j]) * sc[j] + b[j]);
        store(y, r, p.c, c0, k, buf);
      }
    });
  });
}

void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const Rows p = rows_of(x);
  const float *mp = mean.f32(), *ip = invstd.f32();
  float* gs = grad_stats.f32();  // (2, C)
  channel_blocks(ctx, p, [&](int64_t c0, int64_t k) {
    float xb[kRun], gb[kRun];
    double m[kRun], s[kRun] = {}, t[kRun] = {};
    for (int64_t j = 0; j < k; ++j) m[j] = static_cast<double>(mp[c0 + j]) + mp[p.c + c0 + j];
    for (int64_t r = 0; r < p.r; ++r) {
      load(x, r, p.c, c0, k, xb);
      load(dy, r, p.c, c0, k, gb);
      for (int64_t j = 0; j < k; ++j) {
        const double g = gb[j];
        s[j] += g;
        t[j] += g * (static_cast<double>(xb[j]) - m[j]);
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      gs[c0 + j] = static_cast<float>(s[j]);
      gs[p.c + c0 + j] = static_cast<float>(t[j] * ip[c0 + j]);  // sum dy * xhat
    }
  });
}

void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  const Rows p = rows_of(x);
  const float *mp = mean.f32(), *ip = invstd.f32(), *gp = gamma.f32(), *gs = grad_stats.f32();
  const double inv_count = 1.0 / static_cast<double>(count);
  with_round(ctx.math.autocast, [&](auto tag) {
    constexpr DType T = decltype(tag)::value;
    row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
      // dx = k * (dy - a) - (x - mean) * q, k = gamma * invstd, a = sum_dy / count,
      // q = k * invstd * sum_dy_xhat / count: the plane kernel's constants.
      float kf[kRun], a[kRun], q[kRun], hi[kRun], lo[kRun], xb[kRun], gb[kRun];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t c = c0 + j;
        const double kd = static_cast<double>(gp[c]) * ip[c];
        kf[j] = static_cast<float>(kd);
        a[j] = static_cast<float>(gs[c] * inv_count);
        q[j] = static_cast<float>(kd * ip[c] * gs[p.c + c] * inv_count);
        hi[j] = mp[c];
        lo[j] = mp[p.c + c];
      }
      for (int64_t r = r0; r < r1; ++r) {
        load(x, r, p.c, c0, k, xb);
        load(dy, r, p.c, c0, k, gb);  // dx may alias dy: read before written
        for (int64_t j = 0; j < k; ++j)
          gb[j] = round_as<T>(kf[j] * (gb[j] - a[j]) - ((xb[j] - hi[j]) - lo[j]) * q[j]);
        store(dx, r, p.c, c0, k, gb);
      }
    });
  });
}

}  // namespace fanout::kernels::cpu::rows
