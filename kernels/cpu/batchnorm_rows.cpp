// CPU batch normalization on channels-last rows (kernels/cpu/batchnorm_rows.h).
// A tensor is (R, C): R = N * spatial rows of C channels, each row contiguous.
// Reductions: threads take channel ranges and walk every row in order, each
// channel's float64 sums taken row after row (vectorized across channels),
// so the results do not depend on the thread count. Elementwise passes:
// threads take row ranges. Values move through float32 buffers of at most
// kRun channels (widened exactly, narrowed to nearest even). The loops over
// a block's rows are also built for AVX2 (FANOUT_AVX2_CLONE, loops.h): the
// same operations in the same order, so the same bits.
#include "kernels/cpu/batchnorm_rows.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/loops.h"
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

#define FANOUT_INLINE [[gnu::always_inline]] inline

// A tensor's (R, C) rows as the loops read and write them.
struct View {
  char* p;
  DType t;
  int64_t row_bytes, es;
  View(const Tensor& x, int64_t c)
      : p(static_cast<char*>(const_cast<void*>(x.raw()))), t(x.dtype()),
        row_bytes(c * static_cast<int64_t>(dtype_size(x.dtype()))), es(static_cast<int64_t>(dtype_size(x.dtype()))) {}
  // Channels [c0, c0 + k) of row r, widened into buf.
  FANOUT_INLINE void load(int64_t r, int64_t c0, int64_t k, float* buf) const {
    widen_short(t, p + r * row_bytes + c0 * es, buf, k);
  }
  // buf into channels [c0, c0 + k) of row r, rounded to the type.
  FANOUT_INLINE void store(int64_t r, int64_t c0, int64_t k, const float* buf) const {
    narrow_short(t, buf, p + r * row_bytes + c0 * es, k);
  }
};

// v rounded to T (F32: v itself), nearest even.
template <DType T>
FANOUT_INLINE float round_as(float v) {
  if constexpr (T == DType::BF16) return half::float_from_bf16(half::bf16_from_float(v));
  else if constexpr (T == DType::F16) return half::float_from_f16(half::f16_from_float(v));
  else return v;
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
  // Evaluation's constants: the running statistics, lo = 0 (exact: (v - m) - 0 is v - m).
  Affine(const Tensor& running_mean, const Tensor& running_var, const Tensor& gamma, const Tensor& beta, float eps,
         int64_t c0, int64_t k) {
    const float *mp = running_mean.f32(), *vp = running_var.f32(), *gp = gamma.f32(), *bp = beta.f32();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t c = c0 + j;
      hi[j] = mp[c];
      lo[j] = 0.0f;
      sc[j] = static_cast<float>(gp[c] / std::sqrt(static_cast<double>(vp[c]) + static_cast<double>(eps)));
      b[j] = bp[c];
    }
  }
  FANOUT_INLINE float operator()(int64_t j, float v) const { return ((v - hi[j]) - lo[j]) * sc[j] + b[j]; }
};

// Sums over rows [0, r) of a block of channels about their pivots (each
// channel's first value): s += v - pivot, q += (v - pivot)^2.
FANOUT_AVX2_CLONE void stats_rows(const View& x, int64_t r, int64_t c0, int64_t k, const double* pivot, double* s,
                                  double* q) {
  float buf[kRun];
  for (int64_t i = 0; i < r; ++i) {
    x.load(i, c0, k, buf);
    for (int64_t j = 0; j < k; ++j) {
      const double v = buf[j] - pivot[j];  // exact
      s[j] += v;
      q[j] += v * v;
    }
  }
}

// What an affine pass does after f: nothing, ReLU, or adds z then ReLU.
enum class Then { kNothing, kRelu, kAddRelu };

// y = f(x) on rows [r0, r1) of a block, rounded to `round` where the unfused
// layers store (F32: nothing between); NaN propagates through the ReLU, as
// relu_forward. z (kAddRelu) is read before y's row is written: y may alias z.
template <DType T>
FANOUT_INLINE void affine_rows_as(const View& x, const View* z, const View& y, const Affine& f, int64_t c0, int64_t k,
                                  int64_t r0, int64_t r1, Then then) {
  float buf[kRun], zb[kRun];
  for (int64_t r = r0; r < r1; ++r) {
    x.load(r, c0, k, buf);
    if (then == Then::kAddRelu) {
      z->load(r, c0, k, zb);
      for (int64_t j = 0; j < k; ++j) {
        const float v = round_as<T>(round_as<T>(f(j, buf[j])) + zb[j]);
        buf[j] = v < 0.0f ? 0.0f : v;
      }
    } else if (then == Then::kRelu) {
      for (int64_t j = 0; j < k; ++j) {
        const float v = round_as<T>(f(j, buf[j]));
        buf[j] = v < 0.0f ? 0.0f : v;
      }
    } else {
      for (int64_t j = 0; j < k; ++j) buf[j] = round_as<T>(f(j, buf[j]));
    }
    y.store(r, c0, k, buf);
  }
}
FANOUT_AVX2_CLONE void affine_rows(const View& x, const View* z, const View& y, const Affine& f, int64_t c0,
                                   int64_t k, int64_t r0, int64_t r1, DType round, Then then) {
  if (round == DType::BF16) affine_rows_as<DType::BF16>(x, z, y, f, c0, k, r0, r1, then);
  else if (round == DType::F16) affine_rows_as<DType::F16>(x, z, y, f, c0, k, r0, r1, then);
  else affine_rows_as<DType::F32>(x, z, y, f, c0, k, r0, r1, then);
}

// Over rows [0, r) of a block: s += dy, t += dy * (x - m).
FANOUT_AVX2_CLONE void grad_sums_rows(const View& x, const View& dy, int64_t r, int64_t c0, int64_t k,
                                      const double* m, double* s, double* t) {
  float xb[kRun], gb[kRun];
  for (int64_t i = 0; i < r; ++i) {
    x.load(i, c0, k, xb);
    dy.load(i, c0, k, gb);
    for (int64_t j = 0; j < k; ++j) {
      const double g = gb[j];
      s[j] += g;
      t[j] += g * (static_cast<double>(xb[j]) - m[j]);
    }
  }
}

// dx = kf * (dy - a) - ((x - hi) - lo) * q on rows [r0, r1) of a block,
// rounded to `round`; dy is read before dx's row is written (dx may alias dy).
struct DxConstants {
  float kf[kRun], a[kRun], q[kRun], hi[kRun], lo[kRun];
};
template <DType T>
FANOUT_INLINE void dx_rows_as(const View& x, const View& dy, const View& dx, const DxConstants& d, int64_t c0,
                              int64_t k, int64_t r0, int64_t r1) {
  float xb[kRun], gb[kRun];
  for (int64_t r = r0; r < r1; ++r) {
    x.load(r, c0, k, xb);
    dy.load(r, c0, k, gb);
    for (int64_t j = 0; j < k; ++j)
      gb[j] = round_as<T>(d.kf[j] * (gb[j] - d.a[j]) - ((xb[j] - d.hi[j]) - d.lo[j]) * d.q[j]);
    dx.store(r, c0, k, gb);
  }
}
FANOUT_AVX2_CLONE void dx_rows(const View& x, const View& dy, const View& dx, const DxConstants& d, int64_t c0,
                               int64_t k, int64_t r0, int64_t r1, DType round) {
  if (round == DType::BF16) dx_rows_as<DType::BF16>(x, dy, dx, d, c0, k, r0, r1);
  else if (round == DType::F16) dx_rows_as<DType::F16>(x, dy, dx, d, c0, k, r0, r1);
  else dx_rows_as<DType::F32>(x, dy, dx, d, c0, k, r0, r1);
}

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
  const View xv(x, p.c);
  channel_blocks(ctx, p, [&](int64_t c0, int64_t k) {
    float buf[kRun];
    double pivot[kRun] = {}, s[kRun] = {}, q[kRun] = {};
    xv.load(0, c0, k, buf);  // pivots: each channel's first value, near its mean
    for (int64_t j = 0; j < k; ++j) pivot[j] = buf[j];
    stats_rows(xv, p.r, c0, k, pivot, s, q);
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
  const View xv(x, p.c), yv(y, p.c);
  row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
    const Affine f(mean, invstd, gamma, beta, p.c, c0, k);
    affine_rows(xv, nullptr, yv, f, c0, k, r0, r1, y.dtype(), Then::kNothing);
  });
}

void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round) {
  const Rows p = rows_of(x);
  const View xv(x, p.c), yv(y, p.c);
  const View zv = z ? View(*z, p.c) : xv;
  row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
    const Affine f(mean, invstd, gamma, beta, p.c, c0, k);
    affine_rows(xv, &zv, yv, f, c0, k, r0, r1, round, z ? Then::kAddRelu : Then::kRelu);
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  const Rows p = rows_of(x);
  const View xv(x, p.c), yv(y, p.c);
  row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
    const Affine f(running_mean, running_var, gamma, beta, eps, c0, k);
    affine_rows(xv, nullptr, yv, f, c0, k, r0, r1, y.dtype(), Then::kNothing);
  });
}

void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const Rows p = rows_of(x);
  const float *mp = mean.f32(), *ip = invstd.f32();
  float* gs = grad_stats.f32();  // (2, C)
  const View xv(x, p.c), gv(dy, p.c);
  channel_blocks(ctx, p, [&](int64_t c0, int64_t k) {
    double m[kRun] = {}, s[kRun] = {}, t[kRun] = {};
    for (int64_t j = 0; j < k; ++j) m[j] = static_cast<double>(mp[c0 + j]) + mp[p.c + c0 + j];
    grad_sums_rows(xv, gv, p.r, c0, k, m, s, t);
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
  const View xv(x, p.c), gv(dy, p.c), dv(dx, p.c);
  row_blocks(ctx, p, [&](int64_t c0, int64_t k, int64_t r0, int64_t r1) {
    // dx = k * (dy - a) - (x - mean) * q, k = gamma * invstd, a = sum_dy / count,
    // q = k * invstd * sum_dy_xhat / count: the plane kernel's constants.
    DxConstants d;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t c = c0 + j;
      const double kd = static_cast<double>(gp[c]) * ip[c];
      d.kf[j] = static_cast<float>(kd);
      d.a[j] = static_cast<float>(gs[c] * inv_count);
      d.q[j] = static_cast<float>(kd * ip[c] * gs[p.c + c] * inv_count);
      d.hi[j] = mp[c];
      d.lo[j] = mp[p.c + c];
    }
    dx_rows(xv, gv, dv, d, c0, k, r0, r1, dx.dtype());
  });
}

}  // namespace fanout::kernels::cpu::rows
