// CUDA causal attention (kernels/attention.h), the unfused way: per (b, h)
// the whole T x T score matrix, through the CUDA strided batched GEMM
// (kernels/gemm.h, cuBLAS) and the CUDA softmax kernels (kernels/softmax.h);
// the CPU counterpart is kernels/cpu/attention.cpp.
//
// Forward:  S = scale * Q K^T (B*H GEMMs, T x T), lse = per-row log-sum-exp of
//           S over keys j <= i (lse_rows_kernel: max in float, exp(s - max)
//           summed in double), P = softmax(S, causal) in place, Y = P V.
// Backward: S and P again from Q and K (the same kernels, so the same P as
//           forward), dV = P^T dY, dP = dY V^T, dS = softmax_backward(P, dP)
//           in place, dQ = scale * dS K, dK = scale * dS^T Q (the scale rides
//           the GEMMs' alpha). y and lse are not read: recomputing P through
//           the softmax kernel is as cheap as exp(S - lse) and matches
//           forward bit for bit.
// Scratch: the (B*H, T, T) float matrices (S/P; backward also dP) live in the
// context's grow-only workspace (Context::workspace), carved once per call,
// so a warm step at the same or smaller sizes allocates nothing. That is
// O(B*H*T^2) memory: this path is for moderate T, not a flash kernel.
// Products are float32 (CUBLAS_COMPUTE_32F) unless ctx.math.allow_tf32.
//
// Decode (attention_decode, generation over a key-value cache): one block
// per query row (decode_rows_kernel) on any of the three storages, scores in
// the context's workspace.
//
// BF16 and F16 tensors (lse stays float32) go to cuDNN's fused flash
// attention first (kernels/cuda/attention_cudnn.cu). Where cuDNN refuses the
// shape (a NOT_SUPPORTED status, remembered per shape and logged once), an
// operand is misaligned, or FANOUT_ATTENTION_CUDNN=0, they take the widened
// path: the operands are widened into float32 copies in the same workspace,
// the float32 path above runs on them, and y (forward) or dq, dk, dv
// (backward) are narrowed back, rounded to nearest even. Correct, and more
// accurate than a low-precision kernel, but slower and with 4 to 7 extra
// float32 tensors of q's size in scratch. Either way the path taken is
// recorded for kernels::attention_last_path().
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/softmax.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_cudnn.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

constexpr size_t kAlign = 256;  // bytes; every carved piece starts aligned
using detail::block_max_all;
using detail::kMaxRowThreads;
using detail::row_threads;

// A block per row r of s (rows, t), query i = r mod t: lse[r] = m + log(sum over
// j <= i of exp(s[r, j] - m)), m the max of those entries; NaN when every one
// is -inf or NaN, as the CPU kernel's exp(s - m) gives then.
__global__ void __launch_bounds__(kMaxRowThreads) lse_rows_kernel(const float* s, int64_t t, float* lse) {
  const int64_t r = blockIdx.x;
  const float* sr = s + r * t;
  const int64_t visible = r % t + 1;
  float m = -CUDART_INF_F;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) m = fmaxf(m, sr[j]);
  m = block_max_all(m);
  if (m == -CUDART_INF_F) {  // the whole block takes this branch
    if (threadIdx.x == 0) lse[r] = CUDART_NAN_F;
    return;
  }
  double sum = 0.0, unused = 0.0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += expf(__fsub_rn(sr[j], m));
  detail::block_sum2_all(sum, unused);
  if (threadIdx.x == 0) lse[r] = static_cast<float>(static_cast<double>(m) + log(sum));
}

// Hands out aligned pieces of one workspace block, sized in a first pass.
class Carver {
 public:
  explicit Carver(char* base = nullptr) : base_(base) {}
  float* take(int64_t floats) {
    char* p = base_ ? base_ + used_ : nullptr;
    used_ += (static_cast<size_t>(floats) * sizeof(float) + kAlign - 1) / kAlign * kAlign;
    return reinterpret_cast<float*>(p);
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

struct Dims {
  int64_t bh, t, d;
  int64_t n() const { return bh * t * d; }  // elements of q
  int64_t tt() const { return t * t; }
  int64_t td() const { return t * d; }
};

Dims dims_of(const Tensor& q) { return {q.size(0) * q.size(1), q.size(2), q.size(3)}; }

// The context's workspace, at least as large as what plan(carver) takes, as a
// carver over it. plan must take the same pieces in the same order both times.
template <class Plan>
void with_scratch(Context& ctx, const Plan& plan) {
  Carver sizing;
  plan(sizing);
  Carver real(static_cast<char*>(ctx.workspace(sizing.used())));
  plan(real);
}

// S (bh, t, t) = scale * Q K^T, then P = softmax(S, causal) in place; with
// lse non-null, lse = S's row log-sum-exp before the softmax.
void scores_to_probs(Context& ctx, const Dims& m, const float* q, const float* k, float scale, float* s, float* lse) {
  gemm_strided_batched(ctx, false, true, m.t, m.t, m.d, scale, q, m.d, m.td(), k, m.d, m.td(), 0.0f, s, m.t, m.tt(),
                       m.bh);
  const int64_t rows = m.bh * m.t;
  if (lse) {
    lse_rows_kernel<<<static_cast<unsigned>(rows), row_threads(m.t), 0, detail::stream_of(ctx)>>>(s, m.t, lse);
    FANOUT_CUDA_CHECK_LAUNCH();
  }
  Tensor st = Tensor::wrap(s, Shape{m.bh, m.t, m.t}, DType::F32, ctx.device());
  // A row of -inf or NaN scores gives NaN, as on the CPU (softmax's op gives zeros there).
  detail::softmax_forward_rows(ctx, st, true, /*empty_nan=*/true, st);
}

void forward_f32(Context& ctx, const Dims& m, const float* q, const float* k, const float* v, float scale, float* s,
                 float* y, float* lse) {
  scores_to_probs(ctx, m, q, k, scale, s, lse);
  gemm_strided_batched(ctx, false, false, m.t, m.d, m.t, 1.0f, s, m.t, m.tt(), v, m.d, m.td(), 0.0f, y, m.d, m.td(),
                       m.bh);
}

void backward_f32(Context& ctx, const Dims& m, const float* q, const float* k, const float* v, float scale,
                  const float* dy, float* p, float* dp, float* dq, float* dk, float* dv) {
  scores_to_probs(ctx, m, q, k, scale, p, nullptr);
  // dV = P^T dY; dP = dY V^T.
  gemm_strided_batched(ctx, true, false, m.t, m.d, m.t, 1.0f, p, m.t, m.tt(), dy, m.d, m.td(), 0.0f, dv, m.d, m.td(),
                       m.bh);
  gemm_strided_batched(ctx, false, true, m.t, m.t, m.d, 1.0f, dy, m.d, m.td(), v, m.d, m.td(), 0.0f, dp, m.t, m.tt(),
                       m.bh);
  // dS = P * (dP - rowsum(dP * P)), in place of dP (masked entries: P = 0, dS = 0).
  Tensor pt = Tensor::wrap(p, Shape{m.bh, m.t, m.t}, DType::F32, ctx.device());
  Tensor dpt = Tensor::wrap(dp, Shape{m.bh, m.t, m.t}, DType::F32, ctx.device());
  softmax_backward(ctx, pt, dpt, dpt);
  // dQ = scale * dS K; dK = scale * dS^T Q.
  gemm_strided_batched(ctx, false, false, m.t, m.d, m.t, scale, dp, m.t, m.tt(), k, m.d, m.td(), 0.0f, dq, m.d,
                       m.td(), m.bh);
  gemm_strided_batched(ctx, true, false, m.t, m.d, m.t, scale, dp, m.t, m.tt(), q, m.d, m.td(), 0.0f, dk, m.d,
                       m.td(), m.bh);
}

// attention_decode, a block per query row r = (bh, i) of q (rows, D): its
// scores over the n - Tq + i + 1 keys it sees into s (a row of n floats),
// their max, p = exp(score - max) in place and its sum (double), then y's
// D sums over the keys (double), one thread per d.
template <class E>
__global__ void __launch_bounds__(kMaxRowThreads) decode_rows_kernel(const E* q, const E* k, const E* v, int64_t tq,
                                                                     int64_t tk, int64_t d, int64_t n, float scale,
                                                                     float* s, E* y) {
  const int64_t r = blockIdx.x, bh = r / tq, i = r % tq, visible = n - tq + i + 1;
  const E* qr = q + r * d;
  const E* kh = k + bh * tk * d;
  const E* vh = v + bh * tk * d;
  float* sr = s + r * n;
  float m = -CUDART_INF_F;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    float dot = 0.0f;
    for (int64_t c = 0; c < d; ++c) dot += detail::widen(qr[c]) * detail::widen(kh[j * d + c]);
    sr[j] = scale * dot;
    m = fmaxf(m, sr[j]);
  }
  m = block_max_all(m);  // also orders the score writes before the reads below
  double sum = 0.0, unused = 0.0;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
    sr[j] = expf(__fsub_rn(sr[j], m));
    sum += sr[j];
  }
  detail::block_sum2_all(sum, unused);  // its barriers order the p writes before the reads below
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    double acc = 0.0;
    for (int64_t j = 0; j < visible; ++j) acc += static_cast<double>(sr[j]) * detail::widen(vh[j * d + c]);
    y[r * d + c] = detail::narrow<E>(static_cast<float>(acc / sum));
  }
}

// A float32 view of scratch memory of t's shape.
Tensor f32_like(Context& ctx, float* p, const Tensor& t) { return Tensor::wrap(p, t.shape(), DType::F32, ctx.device()); }

// dst (float32 scratch) = widen(src).
void widen(Context& ctx, const Tensor& src, float* dst) {
  Tensor d = f32_like(ctx, dst, src);
  convert(ctx, src, d);
}
// dst (low type) = narrow(src), src float32 scratch.
void narrow(Context& ctx, float* src, Tensor& dst) {
  Tensor s = f32_like(ctx, src, dst);
  convert(ctx, s, dst);
}

}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale, Tensor& y,
                       Tensor& lse) {
  detail::DeviceScope scope(ctx);
  const Dims m = dims_of(q);
  if (q.dtype() == DType::F32) {
    with_scratch(ctx, [&](Carver& c) {
      float* s = c.take(m.bh * m.tt());
      if (s) forward_f32(ctx, m, q.f32(), k.f32(), v.f32(), scale, s, y.f32(), lse.f32());
    });
    kernels::detail::note_attention_path(AttentionPass::Forward, "cuda-float32");
    return;
  }
  if (cudnn_attention_forward(ctx, q, k, v, scale, y, lse)) {
    kernels::detail::note_attention_path(AttentionPass::Forward, "cudnn-fused");
    return;
  }
  kernels::detail::note_attention_path(AttentionPass::Forward, "cuda-widened");
  with_scratch(ctx, [&](Carver& c) {
    float *q32 = c.take(m.n()), *k32 = c.take(m.n()), *v32 = c.take(m.n()), *y32 = c.take(m.n());
    float* s = c.take(m.bh * m.tt());
    if (!s) return;  // the sizing pass
    widen(ctx, q, q32);
    widen(ctx, k, k32);
    widen(ctx, v, v32);
    forward_f32(ctx, m, q32, k32, v32, scale, s, y32, lse.f32());
    narrow(ctx, y32, y);
  });
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                        const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  detail::DeviceScope scope(ctx);
  const Dims m = dims_of(q);
  if (q.dtype() == DType::F32) {
    with_scratch(ctx, [&](Carver& c) {
      float *p = c.take(m.bh * m.tt()), *dp = c.take(m.bh * m.tt());
      if (p) backward_f32(ctx, m, q.f32(), k.f32(), v.f32(), scale, dy.f32(), p, dp, dq.f32(), dk.f32(), dv.f32());
    });
    kernels::detail::note_attention_path(AttentionPass::Backward, "cuda-float32");
    return;
  }
  // The fused backward reads y and lse (cuDNN's softmax statistics); the
  // widened one below recomputes P from q and k and reads neither.
  if (cudnn_attention_backward(ctx, q, k, v, scale, y, lse, dy, dq, dk, dv)) {
    kernels::detail::note_attention_path(AttentionPass::Backward, "cudnn-fused");
    return;
  }
  kernels::detail::note_attention_path(AttentionPass::Backward, "cuda-widened");
  with_scratch(ctx, [&](Carver& c) {
    float *q32 = c.take(m.n()), *k32 = c.take(m.n()), *v32 = c.take(m.n()), *dy32 = c.take(m.n());
    float *dq32 = c.take(m.n()), *dk32 = c.take(m.n()), *dv32 = c.take(m.n());
    float *p = c.take(m.bh * m.tt()), *dp = c.take(m.bh * m.tt());
    if (!p) return;  // the sizing pass
    widen(ctx, q, q32);
    widen(ctx, k, k32);
    widen(ctx, v, v32);
    widen(ctx, dy, dy32);
    backward_f32(ctx, m, q32, k32, v32, scale, dy32, p, dp, dq32, dk32, dv32);
    narrow(ctx, dq32, dq);
    narrow(ctx, dk32, dk);
    narrow(ctx, dv32, dv);
  });
}

void attention_decode(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n, float scale,
                      Tensor& y) {
  detail::DeviceScope scope(ctx);
  const int64_t rows = q.size(0) * q.size(1) * q.size(2), tq = q.size(2), d = q.size(3), tk = k.size(2);
  float* s = static_cast<float*>(ctx.workspace(static_cast<size_t>(rows * n) * sizeof(float)));
  detail::with_storage(q.dtype(), [&](auto tag) {
    using E = decltype(tag);
    decode_rows_kernel<E><<<static_cast<unsigned>(rows), row_threads(std::max(n, d)), 0, detail::stream_of(ctx)>>>(
        static_cast<const E*>(q.raw()), static_cast<const E*>(k.raw()), static_cast<const E*>(v.raw()), tq, tk, d, n,
        scale, s, static_cast<E*>(y.raw()));
    FANOUT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace fanout::kernels::cuda
