// CPU softmax cross-entropy (max-subtracted, loss accumulated in double) with
// PyTorch's label smoothing, accuracy counting and the gradient, on logits of
// any floating storage (a row at a time through float32); mean squared error
// and plane argmax.
#include "kernels/loss.h"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.h"
#include "runtime/core/half.h"

#include "kernels/cpu/parallel.h"
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
    float m = z[0];
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j) {
      m = z[j] > m ? z[j] : m;
      if (!std::isnan(z[best]) && (z[j] > z[best] || std::isnan(z[j]))) best = j;
    }
    hit_of[i] = best == y ? 1 : 0;
    const double zy = ignored ? 0.0 : static_cast<double>(z[y]);  // read before d overwrites z
    // p = exp(z - m) / sum; log p_j = (z_j - m) - log(sum). exp(z - m) waits in d.
    double sum = 0.0, sum_shifted = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const float zj = z[j];
      const float e = std::exp(zj - m);
      if (d) d[j] = e;
      sum += e;
      sum_shifted += static_cast<double>(zj) - m;
    }
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
    for (int64_t j = 0; j < k; ++j) {
      const float p = d[j] * inv;
      float g = scale * (p - off);
      if (j == y) g -= scale * on;
      d[j] = rounded(g, out.round);
    }
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
