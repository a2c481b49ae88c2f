// CPU causal attention, FlashAttention's way, blocked in both directions:
// blocks of kRows = 32 rows against blocks of kCols = 64 of the other side,
// holding the scores of one kRows x kCols block only (never T x T). Two
// register-blocked micro-kernels (4 rows x 16 columns of 8-lane vectors) do
// every product: scores (A B^T against the head's B transposed once per
// thread and head, so the inner loop runs over 16 contiguous columns) and
// rowmat (P M, the inner loop over 16 contiguous d).
//  - forward: work items (b, h, block of query rows) split over threads by
//    parallel_for; for each key block up to the diagonal S = scale Q K^T,
//    the online softmax (row max subtracted; p = exp(s - m) by a vectorized
//    polynomial exp), then P V. Within a block the sums are float; across
//    blocks the running sum and the output accumulate in double (measured
//    against float64 in attention_test: worst 4e-7 of the largest value,
//    T up to 1024).
//  - backward: work items are whole heads. It recomputes p = exp(s - lse)
//    from forward's lse, walks the key blocks in order and works on their
//    transposed blocks (S^T = scale K Q^T, dP^T = V dY^T): dv += P^T dY,
//    dk += dS^T Q, and dq += dS K into the head's double accumulator: five
//    block products per block pair, no pass recomputing P for dq. Per block
//    float, across blocks double, as forward.
//  - decode (attention_decode, generation over a key-value cache): a work
//    item per query row, reading the storage as it is (rows widened as read),
//    scores, their sum and y's sums in double.
// Every output element is computed by a fixed sequence of operations that
// depends on its head's shape only (fixed blocks; a thread takes whole work
// items): results do not depend on the thread count, nor on how many heads
// a call holds (DataParallel replicas). The products are written as mul then
// add (-ffp-contract=off), so the AVX2 clone and the baseline SSE2 build
// give the same bits (checked).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

namespace {

constexpr int64_t kRows = 32;  // rows per block (query rows forward, key rows backward); forward's work item
constexpr int64_t kCols = 64;  // columns per inner block (the other side); row stride of the score blocks

// 8-lane vectors (GCC's vector extensions): one AVX register in the AVX2
// clone, two SSE registers in the baseline build. The helpers taking and
// returning them are always inlined, so no call passes one (hence no -Wpsabi).
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define FANOUT_INLINE [[gnu::always_inline]] inline

FANOUT_INLINE v8 load8(const float* p) {
  v8 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
FANOUT_INLINE void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }
// Constants only: for a run-time value v8{a, ...} compiles to lane inserts; a
// scalar operand of a vector operation is broadcast in one instruction.
FANOUT_INLINE v8 splat(float a) { return v8{a, a, a, a, a, a, a, a}; }

// exp(x) for 8 lanes, Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
// polynomial for exp(r), 2^n through the exponent bits. About 1 ulp; inputs
// clamped to [-88, 88] (exp(-88) comes out 0).
FANOUT_INLINE v8 exp8(v8 x) {
  x = x < splat(-88.0f) ? splat(-88.0f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  const v8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const v8 t = x * splat(1.44269504088896341f) + magic;
  const v8 n = t - magic;
  v8 r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  const v8 z = r * r;
  v8 y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * z + r + splat(1.0f);
  v8i bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4B400000 + 127) << 23;  // t = 0x4B400000 + n as bits
  v8 two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

// One head's X (T x D) transposed into Xt (D x ld, ld >= T rounded up to kCols), columns [T, ld) zero;
// in tiles of 8 x 8 so that neither side strides through the cache.
void transpose_head(const float* X, int64_t T, int64_t D, int64_t ld, float* Xt) {
  for (int64_t c0 = 0; c0 < T; c0 += 8)
    for (int64_t d0 = 0; d0 < D; d0 += 8) {
      const int64_t c1 = std::min(T, c0 + 8), d1 = std::min(D, d0 + 8);
      for (int64_t d = d0; d < d1; ++d)
        for (int64_t c = c0; c < c1; ++c) Xt[d * ld + c] = X[c * D + d];
    }
  for (int64_t d = 0; d < D; ++d) std::fill(Xt + d * ld + T, Xt + (d + 1) * ld, 0.0f);
}

// S[r][c] = scale * sum_d A[r][d] Bt[d][c] (d in order) for R rows and 16 columns.
template <int R>
FANOUT_INLINE void scores_tile(const float* A, int64_t D, const float* Bt, int64_t ldb, float scale, float* S) {
  v8 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = v8{};
  for (int64_t d = 0; d < D; ++d) {
    const v8 b0 = load8(Bt + d * ldb), b1 = load8(Bt + d * ldb + 8);
    for (int r = 0; r < R; ++r) {
      const float a = A[r * D + d];  // a scalar operand is broadcast (vbroadcastss)
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    store8(S + r * kCols, acc[r][0] * scale);
    store8(S + r * kCols + 8, acc[r][1] * scale);
  }
}

// S (nr x kCols) = scale * A Bt for A's nr rows (stride D) and Bt's (row stride ldb) columns [0, npad),
// npad a multiple of 16.
FANOUT_INLINE void scores(const float* A, int64_t nr, int64_t D, const float* Bt, int64_t ldb, int64_t npad,
                          float scale, float* S) {
  for (int64_t c = 0; c < npad; c += 16) {
    int64_t r = 0;
    for (; r + 4 <= nr; r += 4) scores_tile<4>(A + r * D, D, Bt + c, ldb, scale, S + r * kCols + c);
    for (; r < nr; ++r) scores_tile<1>(A + r * D, D, Bt + c, ldb, scale, S + r * kCols + c);
  }
}

// O[r][d] = sum_{c < nc} P[r][c] M[c][d] (c in order) for R rows; P's row stride ldp, M's D.
template <int R>
FANOUT_INLINE void rowmat_tile(const float* P, int64_t ldp, int64_t nc, const float* M, int64_t D, float* O) {
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) {
    v8 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = v8{};
    for (int64_t c = 0; c < nc; ++c) {
      const v8 b0 = load8(M + c * D + d), b1 = load8(M + c * D + d + 8);
      for (int r = 0; r < R; ++r) {
        const float a = P[r * ldp + c];
        acc[r][0] += a * b0;
        acc[r][1] += a * b1;
      }
    }
    for (int r = 0; r < R; ++r) {
      store8(O + r * D + d, acc[r][0]);
      store8(O + r * D + d + 8, acc[r][1]);
    }
  }
  for (; d + 8 <= D; d += 8) {
    v8 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = v8{};
    for (int64_t c = 0; c < nc; ++c) {
      const v8 b = load8(M + c * D + d);
      for (int r = 0; r < R; ++r) acc[r] += P[r * ldp + c] * b;
    }
    for (int r = 0; r < R; ++r) store8(O + r * D + d, acc[r]);
  }
  for (; d < D; ++d) {
    float acc[R] = {};
    for (int64_t c = 0; c < nc; ++c)
      for (int r = 0; r < R; ++r) acc[r] += P[r * ldp + c] * M[c * D + d];
    for (int r = 0; r < R; ++r) O[r * D + d] = acc[r];
  }
}

// O (nr x D) = P (nr x nc, row stride ldp) M (nc x D).
FANOUT_INLINE void rowmat(const float* P, int64_t ldp, int64_t nr, int64_t nc, const float* M, int64_t D, float* O) {
  int64_t r = 0;
  for (; r + 4 <= nr; r += 4) rowmat_tile<4>(P + r * ldp, ldp, nc, M, D, O + r * D);
  for (; r < nr; ++r) rowmat_tile<1>(P + r * ldp, ldp, nc, M, D, O + r * D);
}

// Sum of p[0, n) in 8 lanes (p padded with zeros up to a multiple of 8), lanes added in a fixed tree.
FANOUT_INLINE float sum8(const float* p, int64_t n) {
  v8 acc{};
  for (int64_t c = 0; c < n; c += 8) acc += load8(p + c);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// max of s[0, n), n >= 1 (exact in any order).
FANOUT_INLINE float row_max(const float* s, int64_t n) {
  float m = s[0];
  int64_t c = 0;
  if (n >= 8) {
    v8 mv = load8(s);
    for (c = 8; c + 8 <= n; c += 8) {
      const v8 x = load8(s + c);
      mv = x > mv ? x : mv;
    }
    for (int l = 0; l < 8; ++l) m = std::max(m, mv[l]);
  }
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}

FANOUT_INLINE int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Float scratch per thread: two score blocks, an output block, two kCols rows, a transposed score block and
// its output block.
size_t float_scratch(int64_t D) {
  return static_cast<size_t>(2 * kRows * kCols + kRows * D + 2 * kCols + kCols * kRows + kCols * D);
}

// One forward work item: query rows [i0, i1) of one head.
// Kt: the head's keys transposed (D x ld).
FANOUT_AVX2_CLONE void forward_rows(const float* qh, const float* Kt, int64_t ld, const float* vh, int64_t D,
                                    float scale, int64_t i0, int64_t i1, float* yh, float* lh, float* fbuf,
                                    double* dbuf) {
  const int64_t nr = i1 - i0;
  float *S = fbuf, *O = S + kRows * kCols;
  double *acc = dbuf, *l = acc + kRows * D;
  float m[kRows];
  for (int64_t r = 0; r < nr; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0;
  }
  std::fill(acc, acc + nr * D, 0.0);
  for (int64_t c0 = 0; c0 < i1; c0 += kCols) {
    const int64_t nc = std::min(kCols, i1 - c0), npad = round_up(nc, 16);
    scores(qh + i0 * D, nr, D, Kt + c0, ld, npad, scale, S);
    for (int64_t r = 0; r < nr; ++r) {
      float* s = S + r * kCols;
      const int64_t valid = std::min(nc, i0 + r - c0 + 1);  // keys c0 + c <= i0 + r (c0 <= i0: valid >= 1)
      float mb = row_max(s, valid);
      const float mn = std::max(m[r], mb);
      const int64_t n8 = round_up(valid, 8);
      for (int64_t c = 0; c < n8; c += 8) store8(s + c, exp8(load8(s + c) - mn));
      for (int64_t c = valid; c < npad; ++c) s[c] = 0.0f;
      const float lb = sum8(s, n8);
      if (mn != m[r]) {
        const double alpha = std::exp(static_cast<double>(m[r]) - static_cast<double>(mn));
        l[r] *= alpha;
        for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= alpha;
        m[r] = mn;
      }
      l[r] += lb;
    }
    rowmat(S, kCols, nr, nc, vh + c0 * D, D, O);
    for (int64_t x = 0; x < nr * D; ++x) acc[x] += O[x];
  }
  for (int64_t r = 0; r < nr; ++r) {
    for (int64_t d = 0; d < D; ++d) yh[(i0 + r) * D + d] = static_cast<float>(acc[r * D + d] / l[r]);
    lh[i0 + r] = static_cast<float>(m[r] + std::log(l[r]));
  }
}

// dk, dv of key rows [j0, j1) of one head: with ds_ij = p_ij (dy_i . v_j - delta_i), dk_j = scale *
// sum_{i >= j} ds_ij q_i and dv_j = sum_{i >= j} p_ij dy_i. Qt, Gt: the head's queries and output gradients transposed (D x ld). Also adds this key block's share of
// dq / scale, sum_{j in block} ds_ij k_j, to dq_acc (the head's T x D, in double).
FANOUT_AVX2_CLONE void dkv_rows(const float* qh, const float* kh, const float* vh, const float* gh, const float* Qt,
                                const float* Gt, int64_t ld, const float* lh, const double* delta, int64_t T,
                                int64_t D, float scale, int64_t j0, int64_t j1, float* dkh, float* dvh,
                                double* dq_acc, float* fbuf, double* dbuf) {
  const int64_t nr = j1 - j0;
  float *St = fbuf, *dPt = St + kRows * kCols;
  float *O = dPt + kRows * kCols, *Lb = O + kRows * D, *Db = Lb + kCols, *Ds = Db + kCols, *Oq = Ds + kCols * kRows;
  double *acc_k = dbuf, *acc_v = acc_k + kRows * D;
  std::fill(acc_k, acc_k + kRows * D * 2, 0.0);
  for (int64_t c0 = j0 / kCols * kCols; c0 < T; c0 += kCols) {
    const int64_t nc = std::min(kCols, T - c0), npad = round_up(nc, 16);
    for (int64_t c = 0; c < npad; ++c) {
      Lb[c] = c < nc ? lh[c0 + c] : 0.0f;
      Db[c] = c < nc ? static_cast<float>(delta[c0 + c]) : 0.0f;
    }
    scores(kh + j0 * D, nr, D, Qt + c0, ld, npad, scale, St);
    scores(vh + j0 * D, nr, D, Gt + c0, ld, npad, 1.0f, dPt);
    for (int64_t r = 0; r < nr; ++r) {
      float *p = St + r * kCols, *ds = dPt + r * kCols;
      const int64_t first = std::max<int64_t>(0, j0 + r - c0);  // queries c0 + c >= j0 + r
      for (int64_t c = first / 8 * 8; c < npad; c += 8) {
        const v8 e = exp8(load8(p + c) - load8(Lb + c));
        store8(p + c, e);
        store8(ds + c, e * (load8(ds + c) - load8(Db + c)));
      }
      for (int64_t c = 0; c < first; ++c) p[c] = ds[c] = 0.0f;
      for (int64_t c = nc; c < npad; ++c) p[c] = ds[c] = 0.0f;
    }
    rowmat(St, kCols, nr, nc, gh + c0 * D, D, O);
    for (int64_t x = 0; x < nr * D; ++x) acc_v[x] += O[x];
    rowmat(dPt, kCols, nr, nc, qh + c0 * D, D, O);
    for (int64_t x = 0; x < nr * D; ++x) acc_k[x] += O[x];
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < nc; ++c) Ds[c * kRows + r] = dPt[r * kCols + c];
    rowmat(Ds, kRows, nc, nr, kh + j0 * D, D, Oq);
    for (int64_t x = 0; x < nc * D; ++x) dq_acc[c0 * D + x] += Oq[x];
  }
  for (int64_t x = 0; x < nr * D; ++x) {
    dkh[j0 * D + x] = static_cast<float>(scale * acc_k[x]);
    dvh[j0 * D + x] = static_cast<float>(acc_v[x]);
  }
}

// One query row of attention_decode on storage of type t (rows widened as
// read): y = softmax(scale q K[0, n)^T) V[0, n), scores, their sum and y's
// sums in double. Scratch: s (n doubles), acc (D doubles), qf and kf (D floats).
FANOUT_AVX2_CLONE void decode_row(DType t, const char* q, const char* K, const char* V, int64_t n, int64_t D,
                                  float scale, char* y, double* s, double* acc, float* qf, float* kf) {
  const size_t row = static_cast<size_t>(D) * dtype_size(t);
  widen_short(t, q, qf, D);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    widen_short(t, K + j * row, kf, D);
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qf[d]) * kf[d];
    s[j] = static_cast<double>(scale) * dot;
    m = std::max(m, s[j]);
  }
  double sum = 0.0;
  std::fill(acc, acc + D, 0.0);
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(s[j] - m);
    sum += p;
    widen_short(t, V + j * row, kf, D);
    for (int64_t d = 0; d < D; ++d) acc[d] += p * kf[d];
  }
  for (int64_t d = 0; d < D; ++d) qf[d] = static_cast<float>(acc[d] / sum);
  narrow_short(t, qf, y, D);
}

// Per-thread scratch grown to `n` elements; no allocation once warm.
template <class V>
auto* scratch(V& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale, Tensor& y,
                       Tensor& lse) {
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), D = q.size(3);
  // Transposes' row stride: whole kCols blocks, plus 16 floats so that rows are not 4 KiB apart (L1 set conflicts).
  const int64_t blocks = (T + kRows - 1) / kRows, ld = round_up(T, kCols) + 16;
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *yp = y.f32(), *lp = lse.f32();
  parallel_for(ctx, heads * blocks, grain_for(kRows * T * D), [&](int64_t w0, int64_t w1) {
    thread_local std::vector<float> fb, tb;
    thread_local std::vector<double> db;
    float* fbuf = scratch(fb, float_scratch(D));
    float* Kt = scratch(tb, static_cast<size_t>(D * ld));
    double* dbuf = scratch(db, static_cast<size_t>(2 * kRows * D + kRows));
    for (int64_t w = w0, cur = -1; w < w1; ++w) {
      const int64_t bh = w / blocks, i0 = (w % blocks) * kRows, i1 = std::min(T, i0 + kRows);
      const int64_t o = bh * T * D;
      if (bh != cur) transpose_head(kp + o, T, D, ld, Kt), cur = bh;
      forward_rows(qp + o, Kt, ld, vp + o, D, scale, i0, i1, yp + o, lp + bh * T, fbuf, dbuf);
    }
  });
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                        const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t heads = q.size(0) * q.size(1), T = q.size(2), D = q.size(3);
  // Transposes' row stride: whole kCols blocks, plus 16 floats so that rows are not 4 KiB apart (L1 set conflicts).
  const int64_t ld = round_up(T, kCols) + 16;
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
  // One head per work item: its key blocks in order, dq summed over them in double in the item's scratch.
  // Not split within a head: dq's order over key blocks must not depend on the thread count, and the work
  // split must not depend on the number of heads either (a DataParallel replica sees fewer of them).
  parallel_for(ctx, heads, grain_for(T * T * D), [&](int64_t h0, int64_t h1) {
    thread_local std::vector<float> fb, tb;
    thread_local std::vector<double> db, qb;
    float* fbuf = scratch(fb, float_scratch(D));
    float* Qt = scratch(tb, static_cast<size_t>(2 * D * ld));
    float* Gt = Qt + D * ld;
    double* dbuf = scratch(db, static_cast<size_t>(2 * kRows * D + kRows));
    double* dq_acc = scratch(qb, static_cast<size_t>(T * D));
    for (int64_t bh = h0; bh < h1; ++bh) {
      const int64_t o = bh * T * D;
      transpose_head(qp + o, T, D, ld, Qt);
      transpose_head(gp + o, T, D, ld, Gt);
      std::fill(dq_acc, dq_acc + T * D, 0.0);
      for (int64_t j0 = 0; j0 < T; j0 += kRows)
        dkv_rows(qp + o, kp + o, vp + o, gp + o, Qt, Gt, ld, lp + bh * T, delta + bh * T, T, D, scale, j0,
                 std::min(T, j0 + kRows), dkp + o, dvp + o, dq_acc, fbuf, dbuf);
      for (int64_t x = 0; x < T * D; ++x) dqp[o + x] = static_cast<float>(scale * dq_acc[x]);
    }
  });
}

void attention_decode(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n, float scale,
                      Tensor& y) {
  const int64_t heads = q.size(0) * q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const DType t = q.dtype();
  const size_t row = static_cast<size_t>(D) * dtype_size(t);
  const char *qp = static_cast<const char*>(q.raw()), *kp = static_cast<const char*>(k.raw()),
             *vp = static_cast<const char*>(v.raw());
  char* yp = static_cast<char*>(y.raw());
  parallel_for(ctx, heads * Tq, grain_for(2 * n * D), [&](int64_t r0, int64_t r1) {
    thread_local std::vector<double> db;
    thread_local std::vector<float> fb;
    double* s = scratch(db, static_cast<size_t>(n + D));
    float* f = scratch(fb, static_cast<size_t>(2 * D));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bh = r / Tq, i = r % Tq;
      decode_row(t, qp + r * row, kp + bh * Tk * row, vp + bh * Tk * row, n - Tq + i + 1, D, scale, yp + r * row, s,
                 s + n, f, f + D);
    }
  });
}

}  // namespace fanout::kernels::cpu
