// CPU softmax cross-entropy (max-subtracted, loss accumulated in double) with
// PyTorch's label smoothing, accuracy counting and the gradient, on logits of
// any floating storage (a row at a time through float32); mean squared error
// and plane argmax.
#include "kernels/loss.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/poly_math.h"
#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

namespace {
// Labels out of range are bad data, reported as one line; -1 (kIgnoreLabel) passes.
// Rows are numbered in the user's batch (ctx.first_row: a replica's offset in it).
inline int64_t checked_label(const Context& ctx, const int32_t* labels, int64_t i, int64_t k, const char* op) {
  const int64_t y = labels[i];
  FANOUT_USER_CHECK((y >= 0 && y < k) || y == kIgnoreLabel) << op << ": label " << y << " at batch row " << ctx.first_row + i
                                     << " is outside [0, " << k << ")";
  return y;
}
}  // namespace

namespace {
// v rounded to t (F32: v itself), nearest even, as round_to rounds.
inline float rounded(float v, DType t) {
  if (t == DType::BF16) return half::float_from_bf16(half::bf16_from_float(v));
  if (t == DType::F16) return half::float_from_f16(half::f16_from_float(v));
  return v;
}

// The row loops below vectorize (this file builds with -fno-trapping-math,
// CMakeLists.txt); double sums go in kLanes lanes, an order that depends on
// k only.
constexpr int kLanes = 8;

// The row's max and whether it holds a NaN (then every output is NaN
// whatever the max). Max is exact, so any order finds it.
FANOUT_AVX2_CLONE float row_max(const float* z, int64_t k, bool* any_nan) {
  float m = z[0], nan = 0.0f;
#pragma omp simd reduction(max : m) reduction(+ : nan)
  for (int64_t j = 0; j < k; ++j) {
    const float v = z[j];
    m = v > m ? v : m;
    nan += v - v;  // 0, or NaN for a NaN (and for an infinity: rechecked by the caller)
  }
  *any_nan = nan != 0.0f;  // NaN != 0
  return m;
}

// acc[j % kLanes] += p[j] - m in double, j over [0, n).
FANOUT_AVX2_CLONE void add_lanes(const float* p, int64_t n, float m, double* acc) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += static_cast<double>(p[j + l]) - m;
  for (; j < n; ++j) acc[j % kLanes] += static_cast<double>(p[j]) - m;
}

// e[j] = exp(z[j] - m); e may be z.
FANOUT_AVX2_CLONE void exp_shifted(const float* z, int64_t n, float m, float* e) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = exp_poly(z[j] - m);
}

// e_j = exp(z_j - m) into d (when non-null; it may be z); the sums of e_j
// and of z_j - m in double. In chunks: z's chunk summed before d overwrites it.
void exp_sums(const float* z, int64_t k, float m, float* d, double* sum, double* shifted) {
  constexpr int64_t kChunk = 512;  // a multiple of kLanes: the lanes continue across chunks
  double se[kLanes] = {}, ss[kLanes] = {};
  float buf[kChunk];
  for (int64_t j = 0; j < k; j += kChunk) {
    const int64_t n = std::min(kChunk, k - j);
    add_lanes(z + j, n, m, ss);
    float* e = d ? d + j : buf;
    exp_shifted(z + j, n, m, e);
    add_lanes(e, n, 0.0f, se);
  }
  double a = 0.0, b = 0.0;
  for (int l = 0; l < kLanes; ++l) {
    a += se[l];
    b += ss[l];
  }
  *sum = a;
  *shifted = b;
}

// d_j = rounded(scale (d_j inv - off)): every entry's gradient but the label's.
FANOUT_AVX2_CLONE void grad_row(float* d, int64_t k, float inv, float scale, float off, DType round) {
  if (round == DType::BF16) {
#pragma omp simd
    for (int64_t j = 0; j < k; ++j) d[j] = half::float_from_bf16(half::bf16_from_float(scale * (d[j] * inv - off)));
  } else if (round == DType::F16) {
    for (int64_t j = 0; j < k; ++j) d[j] = rounded(scale * (d[j] * inv - off), round);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < k; ++j) d[j] = scale * (d[j] * inv - off);
  }
}
}  // namespace

void softmax_xent(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& loss,
                  const XentOutputs& out) {
  const int64_t n = logits.size(0), k = logits.size(1);
  const DType t = logits.dtype();  // dlogits, when given, are of this type too (the entry point stages otherwise)
  const int32_t* yp = labels.data<int32_t>();
  float* rl = out.row_loss ? out.row_loss->f32() : nullptr;  // (N)
  const double s = smoothing;
  const float off = smoothing / static_cast<float>(k);  // target s/K off the label
  const float on = 1.0f - smoothing;                   // plus (1 - s) on the label
  const float scale = out.scale;
  for (int64_t i = 0; i < n; ++i) checked_label(ctx, yp, i, k, "softmax_xent");  // before dlogits overwrite logits
  // Each row's double loss and hit wait in the workspace and are added in row
  // order (any thread count); low-type rows go through a float32 row buffer
  // per block of rows, after them.
  const int blocks = t == DType::F32 ? 1 : static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n, threads(ctx))));
  const size_t head = (static_cast<size_t>(n) * (sizeof(double) + 1) + 63) / 64 * 64;
  char* ws = static_cast<char*>(
      ctx.workspace(head + (t == DType::F32 ? 0 : static_cast<size_t>(blocks) * static_cast<size_t>(k) * sizeof(float))));
  auto* li_of = reinterpret_cast<double*>(ws);
  auto* hit_of = reinterpret_cast<uint8_t*>(li_of + n);
  // Row i from z (k values) with its gradient into d (may be z, or null).
  auto row = [&](int64_t i, const float* z, float* d) {
    const int64_t y = yp[i];
    const bool ignored = y == kIgnoreLabel;
    // The max for the softmax, and torch.argmax's (the first NaN, else the first maximum).
    bool any_nan = false;
    const float m = row_max(z, k, &any_nan);
    int64_t best = k;
    if (any_nan)
      for (int64_t j = 0; j < k && best == k; ++j)
        if (std::isnan(z[j])) best = j;
    if (best == k)  // no NaN: the first maximum (m is one of the row's values)
      for (best = 0; best + 1 < k && z[best] != m;) ++best;
    hit_of[i] = best == y ? 1 : 0;
    const double zy = ignored ? 0.0 : static_cast<double>(z[y]);  // read before d overwrites z
    // p = exp(z - m) / sum; log p_j = (z_j - m) - log(sum). exp(z - m) waits in d.
    double sum = 0.0, sum_shifted = 0.0;
    exp_sums(z, k, m, d, &sum, &sum_shifted);
    const double lse = std::log(sum);
    const double nll = lse - (zy - m);                                   // -log p_y
    const double mean_nll = lse - sum_shifted / static_cast<double>(k);  // mean_k(-log p_k)
    const double li = ignored ? 0.0 : s > 0.0 ? (1.0 - s) * nll + s * mean_nll : nll;  // a -inf logit: mean_nll inf
    li_of[i] = li;
    if (rl) rl[i] = static_cast<float>(li);
    if (!d) return;
    if (ignored) {
      std::fill(d, d + k, 0.0f);
      return;
    }
    const float inv = static_cast<float>(1.0 / sum);
    const float ey = d[y];
    grad_row(d, k, inv, scale, off, out.round);
    d[y] = rounded(scale * (ey * inv - off) - scale * on, out.round);
  };
  if (t == DType::F32) {
    const float* zp = logits.f32();                          // (N, K)
    float* dp = out.dlogits ? out.dlogits->f32() : nullptr;  // (N, K), may be zp
    parallel_for(ctx, n, grain_for(k), [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) row(i, zp + i * k, dp ? dp + i * k : nullptr);
    });
  } else {
    // Each row widened into its block's buffer (exact), computed there as a
    // float32 row, its gradient stored rounded to the type: the bits of the
    // float32 call on a widened copy.
    const size_t es = dtype_size(t);
    const char* zp = static_cast<const char*>(logits.raw());
    char* dp = out.dlogits ? static_cast<char*>(out.dlogits->raw()) : nullptr;
    float* bufs = reinterpret_cast<float*>(ws + head);
    parallel_for(ctx, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        float* buf = bufs + b * k;
        for (int64_t i = n * b / blocks; i < n * (b + 1) / blocks; ++i) {
          widen_span(t, zp + i * k * es, buf, k);
          row(i, buf, dp ? buf : nullptr);
          if (dp) narrow_span(t, buf, dp + i * k * es, k);
        }
      }
    });
  }
  double total = 0.0;
  int64_t counted = 0;
  int32_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += li_of[i];
    counted += yp[i] == kIgnoreLabel ? 0 : 1;
    hits += hit_of[i];
  }
  loss.f32()[0] = static_cast<float>(total / static_cast<double>(counted));  // NaN when every row is ignored
  if (out.correct) out.correct->data<int32_t>()[0] = hits;
}

void mse_forward(Context&, const Tensor& out, const Tensor& target, float scale, Tensor& row_loss, Tensor* grad) {
  const int64_t n = out.size(0), e = out.numel() / n;
  const float* o = out.f32();
  const float* t = target.f32();
  float* rl = row_loss.f32();
  float* g = grad ? grad->f32() : nullptr;
  const float gs = static_cast<float>(2.0 * scale / static_cast<double>(e));
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int64_t j = i * e; j < (i + 1) * e; ++j) {
      const float d = o[j] - t[j];
      sum += static_cast<double>(d) * d;
      if (g) g[j] = gs * d;  // after reading o[j]: grad may alias out
    }
    rl[i] = static_cast<float>(sum / static_cast<double>(e));
  }
}

void plane_argmax(Context&, const Tensor& x, Tensor& idx, Tensor& val) {
  const int64_t p = x.size(0), s = x.size(1);
  const float* xp = x.f32();
  for (int64_t i = 0; i < p; ++i) {
    const float* v = xp + i * s;
    int64_t best = 0;  // torch.argmax: the first NaN, else the first maximum
    for (int64_t j = 1; j < s && !std::isnan(v[best]); ++j)
      if (v[j] > v[best] || std::isnan(v[j])) best = j;
    idx.data<int32_t>()[i] = static_cast<int32_t>(best);
    val.f32()[i] = v[best];
  }
}

}  // namespace fanout::kernels::cpu
