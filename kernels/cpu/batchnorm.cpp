// CPU batch normalization. Tensors are viewed as (N, C, S) with S the product
// of the spatial dims (1 for (N, C) input); each (n, c) plane is contiguous.
// Reductions accumulate in double with 16 independent partial sums per
// channel (and one for the last values of each plane), vectorized;
// elementwise passes use per-channel constants, no division.
// Threads take whole channels (reductions) or planes (elementwise passes),
// so the results do not depend on their number. Channels-last tensors (any
// floating storage) go to the row kernels of kernels/cpu/batchnorm_rows.h.
#include "kernels/batchnorm.h"
#include "kernels/activation.h"
#include "kernels/convert.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/batchnorm_rows.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "runtime/core/half.h"

namespace fanout::kernels::cpu {

namespace {

struct Planes {
  int64_t n, c, s;
};
Planes planes_of(const Tensor& x) {
  const int64_t n = x.size(0), c = x.size(1);
  return {n, c, n * c == 0 ? 0 : x.numel() / (n * c)};
}

// The reductions keep 16 independent float64 partial sums per channel, four
// vectors of four (lane j takes the j-th value of every group of 16 in a
// plane; a plane's remaining groups of 4 go to the first vector, its last 0
// to 3 values to one more sum), added pairwise at the end: the order depends
// on the shape only. Written with vector types because
// g++ vectorizes the plain loops badly; FANOUT_AVX2_CLONE (loops.h).
typedef double d4 __attribute__((vector_size(32)));

inline double total(const d4 (&a)[4]) {
  const d4 v = (a[0] + a[2]) + (a[1] + a[3]);
  return (v[0] + v[2]) + (v[1] + v[3]);
}

// Over the planes x + n * stride (n < planes) of len floats:
// s = sum (x - k), q = sum (x - k)^2, in float64 (x - k is exact).
FANOUT_AVX2_CLONE void channel_sum_sumsq(const float* x, int64_t planes, int64_t stride, int64_t len, double k,
                                         double& s, double& q) {
  d4 as[4] = {}, aq[4] = {};
  double ts = 0, tq = 0;
  for (int64_t n = 0; n < planes; ++n) {
    const float* p = x + n * stride;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int j = 0; j < 4; ++j) {
        const float* e = p + i + 4 * j;
        const d4 v = d4{e[0], e[1], e[2], e[3]} - k;
        as[j] += v;
        aq[j] += v * v;
      }
    for (; i + 4 <= len; i += 4) {
      const d4 v = d4{p[i], p[i + 1], p[i + 2], p[i + 3]} - k;
      as[0] += v;
      aq[0] += v * v;
    }
    for (; i < len; ++i) {
      const double v = p[i] - k;
      ts += v;
      tq += v * v;
    }
  }
  s = total(as) + ts;
  q = total(aq) + tq;
}

// The same planes of x and dy: s = sum dy, t = sum dy * (x - m), in float64.
FANOUT_AVX2_CLONE void channel_sum_dy_dyxmu(const float* x, const float* dy, int64_t planes, int64_t stride,
                                            int64_t len, double m, double& s, double& t) {
  d4 as[4] = {}, at[4] = {};
  double ts = 0, tt = 0;
  for (int64_t n = 0; n < planes; ++n) {
    const float *px = x + n * stride, *pg = dy + n * stride;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16)
      for (int j = 0; j < 4; ++j) {
        const float *eg = pg + i + 4 * j, *ex = px + i + 4 * j;
        const d4 g = d4{eg[0], eg[1], eg[2], eg[3]};
        as[j] += g;
        at[j] += g * (d4{ex[0], ex[1], ex[2], ex[3]} - m);
      }
    for (; i + 4 <= len; i += 4) {
      const d4 g = d4{pg[i], pg[i + 1], pg[i + 2], pg[i + 3]};
      as[0] += g;
      at[0] += g * (d4{px[i], px[i + 1], px[i + 2], px[i + 3]} - m);
    }
    for (; i < len; ++i) {
      const double g = pg[i];
      ts += g;
      tt += g * (static_cast<double>(px[i]) - m);
    }
  }
  s = total(as) + ts;
  t = total(at) + tt;
}

// y = (x - m) * k + b over len floats; y may alias x.
inline void affine(const float* x, int64_t len, float m, float k, float b, float* y) {
  map1(x, y, len, [m, k, b](float v) { return (v - m) * k + b; });
}

// The same with m = hi + lo: x - hi is exact when x is near hi.
inline void affine2(const float* x, int64_t len, float hi, float lo, float k, float b, float* y) {
  map1(x, y, len, [hi, lo, k, b](float v) { return ((v - hi) - lo) * k + b; });
}

}  // namespace

void bn_stats(Context& ctx, const Tensor& x, Tensor& stats) {
  if (x.channels_last()) return rows::bn_stats(ctx, x, stats);
  const Planes p = planes_of(x);
  const float* xp = x.f32();
  double* sp = stats.f64();  // (3, C)
  const double count = static_cast<double>(p.n * p.s);
  parallel_for(ctx, p.c, grain_for(p.n * p.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      if (count == 0) {
        sp[c] = sp[p.c + c] = sp[2 * p.c + c] = 0;
        continue;
      }
      const double k = xp[c * p.s];  // pivot: the channel's first value, near its mean
      double a, q;
      channel_sum_sumsq(xp + c * p.s, p.n, p.c * p.s, p.s, k, a, q);
      const double s = a + count * k;
      sp[c] = s;
      sp[p.c + c] = std::max(0.0, q - a * a / count);
      sp[2 * p.c + c] = s * s / count;
    }
  });
}

void bn_finalize(Context&, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var) {
  const int64_t nc = stats.size(1);
  const double* sp = stats.f64();
  float* mp = mean.f32();  // (2, C): hi, lo
  float* ip = invstd.f32();
  float* rm = running_mean ? running_mean->f32() : nullptr;
  float* rv = running_var ? running_var->f32() : nullptr;
  const double inv_count = 1.0 / static_cast<double>(count);
  const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  const double mom = momentum;
  for (int64_t c = 0; c < nc; ++c) {
    const double s = sp[c], m = s * inv_count;
    // Pooled: the deviations within each replica plus those of the replicas' means.
    const double between = std::max(0.0, sp[2 * nc + c] - s * s / static_cast<double>(count));
    const double var = (sp[nc + c] + between) * inv_count;  // biased
    const float hi = static_cast<float>(m);
    mp[c] = hi;
    mp[nc + c] = static_cast<float>(m - hi);
    ip[c] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    if (rm) rm[c] = static_cast<float>((1.0 - mom) * rm[c] + mom * m);
    if (rv) rv[c] = static_cast<float>((1.0 - mom) * rv[c] + mom * var * unbias);
  }
}

void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y) {
  if (x.channels_last()) return rows::bn_apply(ctx, x, mean, invstd, gamma, beta, y);
  const Planes p = planes_of(x);
  const float *xp = x.f32(), *mp = mean.f32(), *ip = invstd.f32(), *gp = gamma.f32(), *bp = beta.f32();
  float* yp = y.f32();
  parallel_for(ctx, p.n * p.c, grain_for(p.s), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {  // plane q = (n, c)
      const int64_t c = q % p.c, off = q * p.s;
      affine2(xp + off, p.s, mp[c], mp[p.c + c], ip[c] * gp[c], bp[c], yp + off);
    }
  });
}

namespace {
// v rounded to t (F32: v itself), nearest even, as round_to rounds.
template <DType T>
inline float round_as(float v) {
  if constexpr (T == DType::BF16) return half::float_from_bf16(half::bf16_from_float(v));
  else if constexpr (T == DType::F16) return half::float_from_f16(half::f16_from_float(v));
  else return v;
}
// y = max(((x - hi) - lo) * k + b [+ z], 0) over len floats in one pass,
// float32 throughout (no rounding between); y may alias x or z.
FANOUT_AVX2_CLONE void affine_add_relu(const float* x, const float* z, int64_t len, float hi, float lo, float k,
                                       float b, float* y) {
  if (z) {
    map2(x, z, y, len, [hi, lo, k, b](float v, float zv) {
      const float t = ((v - hi) - lo) * k + b + zv;
      return t < 0.0f ? 0.0f : t;
    });
  } else {
    map1(x, y, len, [hi, lo, k, b](float v) {
      const float t = ((v - hi) - lo) * k + b;
      return t < 0.0f ? 0.0f : t;
    });
  }
}

// The same, rounded to T after the normalization and after the add, as the
// unfused layers store (elementwise: z[i] is read before y[i] is written).
template <DType T>
void affine_add_relu_rounded(const float* x, const float* z, int64_t len, float hi, float lo, float k, float b,
                             float* y) {
  for (int64_t i = 0; i < len; ++i) {
    float v = round_as<T>(((x[i] - hi) - lo) * k + b);
    if (z) v = round_as<T>(v + z[i]);
    y[i] = v < 0.0f ? 0.0f : v;  // NaN propagates, as relu_forward
  }
}
}  // namespace

void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round) {
  if (x.channels_last()) return rows::bn_apply_add_relu(ctx, x, mean, invstd, gamma, beta, z, y, round);
  const Planes p = planes_of(x);
  const float *xp = x.f32(), *mp = mean.f32(), *ip = invstd.f32(), *gp = gamma.f32(), *bp = beta.f32();
  const float* zp = z ? z->f32() : nullptr;
  float* yp = y.f32();
  auto pass = round == DType::BF16 ? affine_add_relu_rounded<DType::BF16>
              : round == DType::F16 ? affine_add_relu_rounded<DType::F16>
                                    : affine_add_relu;  // nothing to round between: the vector loop
  parallel_for(ctx, p.n * p.c, grain_for(p.s), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {  // plane q = (n, c)
      const int64_t c = q % p.c, off = q * p.s;
      pass(xp + off, zp ? zp + off : nullptr, p.s, mp[c], mp[p.c + c], ip[c] * gp[c], bp[c], yp + off);
    }
  });
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  if (x.channels_last()) return rows::bn_forward_eval(ctx, x, running_mean, running_var, gamma, beta, eps, y);
  const Planes p = planes_of(x);
  const float *xp = x.f32(), *mp = running_mean.f32(), *vp = running_var.f32(), *gp = gamma.f32(),
              *bp = beta.f32();
  float* yp = y.f32();
  parallel_for(ctx, p.c, grain_for(p.n * p.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float k = static_cast<float>(gp[c] / std::sqrt(static_cast<double>(vp[c]) + static_cast<double>(eps)));
      for (int64_t n = 0; n < p.n; ++n) {
        const int64_t off = (n * p.c + c) * p.s;
        affine(xp + off, p.s, mp[c], k, bp[c], yp + off);
      }
    }
  });
}

void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean,
                        const Tensor& invstd, Tensor& grad_stats) {
  if (x.channels_last()) return rows::bn_backward_reduce(ctx, x, dy, mean, invstd, grad_stats);
  const Planes p = planes_of(x);
  const float *xp = x.f32(), *dp = dy.f32(), *mp = mean.f32(), *ip = invstd.f32();
  float* gs = grad_stats.f32();  // (2, C)
  parallel_for(ctx, p.c, grain_for(p.n * p.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double s, t;
      channel_sum_dy_dyxmu(xp + c * p.s, dp + c * p.s, p.n, p.c * p.s, p.s,
                           static_cast<double>(mp[c]) + mp[p.c + c], s, t);
      gs[c] = static_cast<float>(s);
      gs[p.c + c] = static_cast<float>(t * ip[c]);  // sum dy * xhat
    }
  });
}

// The mask over the whole tensor (relu_backward's vector loop), then the
// channel sums: one pass of masking each plane inside the channel walk
// measured no faster here (norm-bench).
void bn_backward_reduce_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                             const Tensor& invstd, Tensor& grad_stats, Tensor& g) {
  relu_backward(ctx, y, dy, g);
  bn_backward_reduce(ctx, x, g, mean, invstd, grad_stats);
}

void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  if (x.channels_last()) return rows::bn_backward_apply(ctx, x, dy, mean, invstd, gamma, grad_stats, count, dx);
  const Planes p = planes_of(x);
  const float *xp = x.f32(), *dp = dy.f32(), *mp = mean.f32(), *ip = invstd.f32(), *gp = gamma.f32(),
              *gs = grad_stats.f32();
  float* out = dx.f32();
  const double inv_count = 1.0 / static_cast<double>(count);
  parallel_for(ctx, p.c, grain_for(p.n * p.s), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // dx = k * (dy - a) - (x - mean) * q, k = gamma * invstd, a = sum_dy / count,
      // q = k * invstd * sum_dy_xhat / count.
      const double k = static_cast<double>(gp[c]) * ip[c];
      const float kf = static_cast<float>(k);
      const float a = static_cast<float>(gs[c] * inv_count);
      const float q = static_cast<float>(k * ip[c] * gs[p.c + c] * inv_count);
      const float hi = mp[c], lo = mp[p.c + c];
      for (int64_t n = 0; n < p.n; ++n) {
        const int64_t off = (n * p.c + c) * p.s;
        // dx may alias dy.
        map2(xp + off, dp + off, out + off, p.s,
             [=](float xv, float g) { return kf * (g - a) - ((xv - hi) - lo) * q; });
      }
    }
  });
}

int64_t bn_relu_mask_bytes(const Context&, const Tensor&) { return 0; }  // the split kernels keep no mask

// The three steps; no bit mask (backward reads y).
bool bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma, const Tensor& beta,
                       float eps, float momentum, Tensor& stats, Tensor& mean, Tensor& invstd,
                       Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor*, DType round) {
  bn_stats(ctx, x, stats);
  bn_finalize(ctx, stats, x.numel() / x.size(1), eps, momentum, mean, invstd, &running_mean, &running_var);
  bn_apply_add_relu(ctx, x, mean, invstd, gamma, beta, z, y, round);
  return false;
}

void bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                      const Tensor& invstd, const Tensor& gamma, const Tensor*, Tensor& grad_stats, Tensor& g,
                      Tensor& dx) {
  bn_backward_reduce_relu(ctx, x, y, dy, mean, invstd, grad_stats, g);
  bn_backward_apply(ctx, x, g, mean, invstd, gamma, grad_stats, x.numel() / x.size(1), dx);
}

}  // namespace fanout::kernels::cpu
