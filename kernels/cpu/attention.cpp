// CPU causal attention, blocked over query rows: the work items are
// (b, h, block of kRows query rows), split over threads by parallel_for, and
// each holds the scores of its own rows only (one row of T at a time).
// Dot products over D are in float; the long reductions over keys (the
// softmax sum, p . v, dq, dk, dv and D = dy . y) are in double. Backward
// recomputes p = exp(s - lse) from forward's lse, FlashAttention's way: one
// pass over query blocks for dq, one over key blocks for dk and dv (so no
// two threads write the same row).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

namespace {

constexpr int64_t kRows = 16;  // query (or key) rows per work item

float dot(const float* a, const float* b, int64_t d) {
  float s = 0.0f;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// Per-thread scratch grown to `n` doubles; no allocation once warm.
double* scratch(std::vector<double>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale, Tensor& y,
                       Tensor& lse) {
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), D = q.size(3);
  const int64_t blocks = (T + kRows - 1) / kRows;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *yp = y.f32(), *lp = lse.f32();
  parallel_for(ctx, heads * blocks, grain_for(kRows * T * D), [&](int64_t w0, int64_t w1) {
    thread_local std::vector<double> buf;
    double* s = scratch(buf, static_cast<size_t>(T + D));  // scores of one row, then its output accumulator
    double* acc = s + T;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bh = w / blocks, i0 = (w % blocks) * kRows, i1 = std::min(T, i0 + kRows);
      const float *qh = qp + bh * T * D, *kh = kp + bh * T * D, *vh = vp + bh * T * D;
      for (int64_t i = i0; i < i1; ++i) {
        const float* qi = qh + i * D;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = static_cast<double>(scale * dot(qi, kh + j * D, D));
          m = std::max(m, s[j]);
        }
        double sum = 0.0;
        std::fill(acc, acc + D, 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - m);
          sum += p;
          const float* vj = vh + j * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += p * vj[d];
        }
        float* yi = yp + bh * T * D + i * D;
        for (int64_t d = 0; d < D; ++d) yi[d] = static_cast<float>(acc[d] / sum);
        lp[bh * T + i] = static_cast<float>(m + std::log(sum));
      }
    }
  });
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                        const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), D = q.size(3);
  const int64_t blocks = (T + kRows - 1) / kRows;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32(), *yp = y.f32(), *lp = lse.f32(), *gp = dy.f32();
  float *dqp = dq.f32(), *dkp = dk.f32(), *dvp = dv.f32();
  // delta_i = dy_i . y_i, every row, in the context's workspace.
  double* delta = static_cast<double*>(ctx.workspace(static_cast<size_t>(heads * T) * sizeof(double)));
  parallel_for(ctx, heads * T, grain_for(D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double s = 0.0;
      for (int64_t d = 0; d < D; ++d) s += static_cast<double>(gp[r * D + d]) * yp[r * D + d];
      delta[r] = s;
    }
  });
  // ds_ij = p_ij (dy_i . v_j - delta_i), p_ij = exp(scale q_i . k_j - lse_i), j <= i.
  auto ds_of = [&](int64_t bh, int64_t i, int64_t j, double* p_out) {
    const int64_t o = bh * T * D;
    const double p = std::exp(static_cast<double>(scale * dot(qp + o + i * D, kp + o + j * D, D)) - lp[bh * T + i]);
    *p_out = p;
    return p * (static_cast<double>(dot(gp + o + i * D, vp + o + j * D, D)) - delta[bh * T + i]);
  };
  // dq_i = scale * sum_{j <= i} ds_ij k_j.
  parallel_for(ctx, heads * blocks, grain_for(kRows * T * D), [&](int64_t w0, int64_t w1) {
    thread_local std::vector<double> buf;
    double* acc = scratch(buf, static_cast<size_t>(D));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bh = w / blocks, i0 = (w % blocks) * kRows, i1 = std::min(T, i0 + kRows);
      const float* kh = kp + bh * T * D;
      for (int64_t i = i0; i < i1; ++i) {
        std::fill(acc, acc + D, 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          double p;
          const double ds = ds_of(bh, i, j, &p);
          for (int64_t d = 0; d < D; ++d) acc[d] += ds * kh[j * D + d];
        }
        float* out = dqp + bh * T * D + i * D;
        for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(scale * acc[d]);
      }
    }
  });
  // dk_j = scale * sum_{i >= j} ds_ij q_i, dv_j = sum_{i >= j} p_ij dy_i.
  parallel_for(ctx, heads * blocks, grain_for(kRows * T * D), [&](int64_t w0, int64_t w1) {
    thread_local std::vector<double> buf;
    double* acc_k = scratch(buf, static_cast<size_t>(2 * D));
    double* acc_v = acc_k + D;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t bh = w / blocks, j0 = (w % blocks) * kRows, j1 = std::min(T, j0 + kRows);
      const float *qh = qp + bh * T * D, *gh = gp + bh * T * D;
      for (int64_t j = j0; j < j1; ++j) {
        std::fill(acc_k, acc_k + 2 * D, 0.0);
        for (int64_t i = j; i < T; ++i) {
          double p;
          const double ds = ds_of(bh, i, j, &p);
          for (int64_t d = 0; d < D; ++d) {
            acc_k[d] += ds * qh[i * D + d];
            acc_v[d] += p * gh[i * D + d];
          }
        }
        float *ok = dkp + bh * T * D + j * D, *ov = dvp + bh * T * D + j * D;
        for (int64_t d = 0; d < D; ++d) {
          ok[d] = static_cast<float>(scale * acc_k[d]);
          ov[d] = static_cast<float>(acc_v[d]);
        }
      }
    }
  });
}

}  // namespace fanout::kernels::cpu
