// Causal attention in bfloat16 / float16 through cuDNN's fused flash attention
// (kernels/attention.h; called by kernels/cuda/attention.cu, which falls back
// to its widened float32 path when this file says no).
//
// cuDNN 9 recognises scaled-dot-product attention as an operation graph of
// generic backend operations (cudnn_graph.h) and runs it as one fused flash
// kernel; the graphs here are the ones cudnn-frontend's composite SDPA nodes
// lower to (no frontend: it is not installed, and the backend API is enough).
// cuDNN 9.19's dedicated CUDNN_BACKEND_OPERATION_SDPA_{FWD,BWD}_DESCRIPTOR
// take no causal mask (a block mask at most; the frontend adds the diagonal
// band as further operations), so the generic graph is the one used.
//
// Forward, per (b, h), with Q, V (B, H, T, D), K^T K's memory seen as
// (B, H, D, T), everything virtual unless named:
//   S  = Q K^T                     MATMUL, float32 accumulation
//   S  = S * scale                 POINTWISE MUL, scale a by-value scalar
//   S  = row >= col ? S : -inf     GEN_INDEX (axis 2 and 3), CMP_GE, BINARY_SELECT
//   M  = rowmax(S)                 REDUCTION MAX        (B, H, T, 1)
//   E  = exp(S - M)                SUB, EXP
//   Z  = rowsum(E)                 REDUCTION ADD        (B, H, T, 1)
//   lse = M + log(Z)               LOG, ADD -> Stats, our lse (float32, natural log)
//   P  = E / Z                     DIV (stored in the I/O type)
//   Y  = P V                       MATMUL -> y
// cuDNN's "Stats" is exactly this: max plus the natural log of the sum of
// exps of the scaled, masked scores (cudnn-frontend's composite softmax), so
// it is the lse of kernels/attention.h with no conversion.
// Backward (the frontend's composite SDPA backward, no dropout, H_q == H_kv):
//   sum = rowsum(dY * Y) * 1       MUL, REDUCTION ADD, MUL -> softmax_sum (float32, scratch)
//   P   = exp(scale * Q K^T - lse), causally masked to 0 (select -inf before EXP)
//   dV  = P^T dY                   RESHAPE (P^T in the I/O type), MATMUL -> dv
//   dS  = scale * P * (dY V^T - sum)
//   dK  = dS^T Q                   RESHAPE, MATMUL -> dk
//   dQ  = dS K                     RESHAPE (K back from K^T), MATMUL -> dQ_accum
//                                  (float32, scratch), IDENTITY -> dq
//
// Plans: per (device, cuDNN handle, direction, B, H, T, D, dtype,
// deterministic) one finalized execution plan, the first engine of cuDNN's
// heuristics (mode A) that finalizes (with ctx.math.deterministic, the first
// without the NONDETERMINISTIC note), built once outside the cache lock and
// kept for the life of the process (like kernels/cuda/conv.cu's plans). The
// handle is a context's, so each context runs only plans finalized with its
// own handle. The scale is a by-value operand bound at each execution, so it
// is not part of the key.
// Executions of one plan are serialized by its mutex (a launch: cheap).
// A warm call builds nothing and allocates no device memory: the plan's
// workspace (and backward's float32 softmax_sum and dQ_accum) come from the
// context's grow-only workspace.
//
// Refusal: when cuDNN answers a status of its NOT_SUPPORTED category (while
// finalizing the graph or a plan, or executing), or its heuristics offer no
// engine that finalizes, the key is remembered as refused (logged once to
// stderr with cuDNN's status) and these functions return false, so the
// caller runs the widened float32 path. Every other cuDNN error throws
// (FANOUT_CUDNN_CHECK): a bad argument is a bug, never a silent fallback.
// Shapes outside cuDNN's documented SDPA support (D not a multiple of 8 or
// above 128, a GPU below compute capability 8.0) are refused without asking.
// Operands whose addresses are not 16-byte aligned (cuDNN's alignment)
// return false without a refusal. FANOUT_ATTENTION_CUDNN=0 turns this path off.
#include "kernels/attention.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention_cudnn.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_graph.cuh"

namespace fanout::kernels::cuda {

namespace {

using namespace cudnn_graph;

constexpr size_t kCarve = 256;  // our scratch pieces start aligned

// Unique ids of the tensors the caller binds at execution.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum,
  kFirstVirtual = 100
};

struct Shape4 {
  int64_t b, h, t, d;
  Dims qkv() const { return {b, h, t, d}; }
  Dims qkv_strides() const { return {h * t * d, t * d, d, 1}; }
  Dims kt() const { return {b, h, d, t}; }  // K^T: K's memory, last two dims swapped
  Dims kt_strides() const { return {h * t * d, t * d, 1, d}; }
  Dims scores() const { return {b, h, t, t}; }
  Dims scores_strides() const { return {h * t * t, t * t, t, 1}; }
  Dims scores_t_strides() const { return {h * t * t, t * t, 1, t}; }  // the transpose view
  Dims rows() const { return {b, h, t, 1}; }
  Dims rows_strides() const { return {h * t, t, 1, 1}; }
};

// s (scores, float32, virtual) with entries above the diagonal replaced by
// -inf, as the frontend's causal (right bound 0) diagonal band mask does it.
cudnnBackendDescriptor_t causal_mask(Graph& g, const Shape4& s, cudnnBackendDescriptor_t scores,
                                     cudnnBackendDescriptor_t neg_inf) {
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, s.scores(), s.scores_strides());
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, row, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, scores, nullptr, nullptr, col, 3);
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  cudnnBackendDescriptor_t masked = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, neg_inf, keep, masked);
  return masked;
}

// scale * Q K^T (float32, virtual).
cudnnBackendDescriptor_t scaled_scores(Graph& g, const Shape4& s, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale) {
  auto qk = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.matmul(q, kt, qk);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_MUL, qk, scale, scaled);
  return scaled;
}

// The tensors both passes bind: Q, K^T (K's memory), O, the softmax
// statistics (lse, float32), and the scale and -inf scalars.
struct PassTensors {
  cudnnBackendDescriptor_t q, kt, o, stats, scale, neg_inf;
};
PassTensors pass_tensors(Graph& g, const Shape4& s) {
  return {g.tensor(kQ, g.io(), s.qkv(), s.qkv_strides(), false),
          g.tensor(kK, g.io(), s.kt(), s.kt_strides(), false),
          g.tensor(kO, g.io(), s.qkv(), s.qkv_strides(), false),
          g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows(), s.rows_strides(), false),
          g.scalar(kScale),
          g.scalar(kNegInf)};
}

cudnnBackendDescriptor_t forward_graph(Graph& g, cudnnHandle_t h, const Shape4& s) {
  const auto F = CUDNN_DATA_FLOAT;
  const auto [q, kt, o, stats, scale, neg_inf] = pass_tensors(g, s);
  auto v = g.tensor(kV, g.io(), s.qkv(), s.qkv_strides(), false);

  auto s2 = scaled_scores(g, s, q, kt, scale);
  auto s3 = causal_mask(g, s, s2, neg_inf);
  auto m = g.virt(F, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s3, m);
  auto centered = g.virt(F, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_SUB, s3, m, centered);
  auto e = g.virt(F, s.scores(), s.scores_strides());
  g.pw1(CUDNN_POINTWISE_EXP, centered, e);
  auto z = g.virt(F, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g.virt(F, s.rows(), s.rows_strides());
  g.pw1(CUDNN_POINTWISE_LOG, z, log_z);
  g.pw2(CUDNN_POINTWISE_ADD, m, log_z, stats);
  auto p = g.virt(g.io(), s.scores(), s.scores_strides());  // the second product's A in the I/O type
  g.pw2(CUDNN_POINTWISE_DIV, e, z, p);
  g.matmul(p, v, o);
  return g.finish(h);
}

// deterministic: dQ = dS K written in the I/O type directly, as the
// frontend builds it then (the float32 accumulator's engines add with atomics).
cudnnBackendDescriptor_t backward_graph(Graph& g, cudnnHandle_t h, const Shape4& s, bool deterministic) {
  const auto F = CUDNN_DATA_FLOAT;
  const auto [q, kt, o, stats, scale, neg_inf] = pass_tensors(g, s);
  auto vt = g.tensor(kV, g.io(), s.kt(), s.kt_strides(), false);
  auto d_o = g.tensor(kDO, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dq = g.tensor(kDQ, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dk = g.tensor(kDK, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dv = g.tensor(kDV, g.io(), s.qkv(), s.qkv_strides(), false);
  auto softmax_sum = g.tensor(kSoftmaxSum, F, s.rows(), s.rows_strides(), false);
  auto one = g.scalar(kOne);

  // softmax_sum = rowsum(dO * O)
  auto d_o_o = g.virt(F, s.qkv(), s.qkv_strides());
  g.pw2(CUDNN_POINTWISE_MUL, d_o, o, d_o_o);
  auto row_dot = g.virt(F, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o, row_dot);
  g.pw2(CUDNN_POINTWISE_MUL, row_dot, one, softmax_sum);

  // P = exp(scale * Q K^T - lse), masked; dV = P^T dO
  auto s2 = scaled_scores(g, s, q, kt, scale);
  auto s3 = g.virt(F, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_SUB, s2, stats, s3);
  auto s4 = causal_mask(g, s, s3, neg_inf);
  auto p = g.virt(F, s.scores(), s.scores_strides());
  g.pw1(CUDNN_POINTWISE_EXP, s4, p);
  auto pt = g.virt(g.io(), s.scores(), s.scores_t_strides());
  g.reshape(p, pt);
  g.matmul(pt, d_o, dv);

  // dS = scale * P * (dO V^T - softmax_sum); dK = dS^T Q
  auto dp = g.virt(F, s.scores(), s.scores_strides());
  g.matmul(d_o, vt, dp);
  auto dp_centered = g.virt(F, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);
  auto ds_unscaled = g.virt(F, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled);
  auto ds = g.virt(F, s.scores(), s.scores_strides());
  g.pw2(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  auto dst = g.virt(g.io(), s.scores(), s.scores_t_strides());
  g.reshape(ds, dst);
  g.matmul(dst, q, dk);

  // dQ = dS K, through the float32 accumulator unless deterministic
  auto k = g.virt(g.io(), s.qkv(), s.qkv_strides());
  g.reshape(kt, k);
  if (deterministic) {
    g.matmul(ds, k, dq);
  } else {
    auto dq_accum = g.tensor(kDQAccum, F, s.qkv(), s.qkv_strides(), false);
    g.matmul(ds, k, dq_accum);
    g.pw1(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  }
  return g.finish(h);
}

enum class Dir : int64_t { Forward = 0, Backward = 1 };

struct FusedPlan {
  std::vector<Desc> keep;  // the graph's descriptors, alive as long as the plan
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;  // bytes cuDNN asks for
  std::atomic<bool> refused{false};  // cuDNN said NOT_SUPPORTED: callers take the widened path
  std::mutex run;         // one execution of this plan at a time
};

using PlanKey = std::array<int64_t, 9>;
using FusedPlans = detail::PlanCache<PlanKey, FusedPlan>;

// The graph for (dir, s, io) and the first heuristic engine that finalizes;
// throws Refused when cuDNN supports none.
std::unique_ptr<FusedPlan> build_plan(cudnnHandle_t h, Dir dir, const Shape4& s, cudnnDataType_t io,
                                      bool deterministic) {
  auto fp = std::make_unique<FusedPlan>();
  Graph g(fp->keep, io, kFirstVirtual);
  cudnnBackendDescriptor_t graph =
      dir == Dir::Forward ? forward_graph(g, h, s) : backward_graph(g, h, s, deterministic);

  const Plan p = first_plan(h, graph, fp->keep, deterministic,
                            std::string("attention ") + (dir == Dir::Forward ? "forward" : "backward"));
  fp->plan = p.plan;
  fp->workspace = p.workspace;
  return fp;
}

const char* dtype_label(DType t) { return t == DType::BF16 ? "bfloat16" : "float16"; }

// FANOUT_ATTENTION_CUDNN=0: never take the fused path.
bool fused_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FANOUT_ATTENTION_CUDNN");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

// The cached plan for the key, built on first use; nullptr when refused.
FusedPlan* get_plan(Context& ctx, cudnnHandle_t h, Dir dir, const Shape4& s, DType dt) {
  const bool det = ctx.math.deterministic;
  // The context is part of the key: a plan is finalized against its handle
  // and only ever runs with it (one context's, on one worker thread); ids are
  // never reused, where a destroyed handle's address may be.
  const PlanKey key{ctx.device().index, static_cast<int64_t>(ctx.id()),
                    static_cast<int64_t>(dir), s.b, s.h, s.t, s.d, static_cast<int64_t>(dt), det};
  // Built unlocked: finalizing may compile kernels (seconds), which must not
  // hold up other devices' workers.
  FusedPlan& cached = FusedPlans::instance().get(key, [&] {
    std::unique_ptr<FusedPlan> plan;
    const auto refuse = [&](const std::string& why) {
      std::fprintf(stderr,
                   "fanout: attention %s %s (B=%lld, H=%lld, T=%lld, D=%lld)%s: cuDNN's fused flash attention refused "
                   "(%s); running the widened float32 path for this shape\n",
                   dir == Dir::Forward ? "forward" : "backward", dtype_label(dt), static_cast<long long>(s.b),
                   static_cast<long long>(s.h), static_cast<long long>(s.t), static_cast<long long>(s.d),
                   det ? " deterministic" : "", why.c_str());
      plan = std::make_unique<FusedPlan>();
      plan->refused = true;
    };
    int major = 0;
    FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx.device().index));
    if (major < 8) {
      // cuDNN's fused flash attention kernels start at Ampere.
      refuse("compute capability " + std::to_string(major) + ".x, below 8.0");
    } else if (s.d % 8 != 0 || s.d > 128) {
      // cudnn-frontend's SDPA support check: the head dimension a multiple of 8,
      // at most 128 (backward; forward and Hopper allow more, kept symmetric).
      refuse("D must be a multiple of 8 and at most 128");
    } else {
      try {
        // Finalizing may load or compile kernels and allocate: calls another
        // thread's graph capture (cuDNN's timed convolution search) forbids.
        ::fanout::detail::CaptureShared capture_safe;
        plan = build_plan(h, dir, s, dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, det);
      } catch (const Refused& r) {
        refuse(r.where + ": " + cudnnGetErrorString(r.status));
      }
    }
    return plan;
  });
  return cached.refused ? nullptr : &cached;
}

void refuse_at_execution(FusedPlan& p, Dir dir, cudnnStatus_t st) {
  std::fprintf(stderr,
               "fanout: attention %s: cuDNN's fused flash attention refused at execution (%s); running the widened "
               "float32 path for this shape from now on\n",
               dir == Dir::Forward ? "forward" : "backward", cudnnGetErrorString(st));
  p.refused = true;
}

size_t round_up(size_t n) { return (n + kCarve - 1) / kCarve * kCarve; }

// The masked scores' value: -inf, or the lowest float for a cuDNN loaded at
// run time older than 9.10, as the frontend chooses (the build's headers may
// be newer than the library the machine has).
float mask_value() {
  static const float v = cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                                   : -std::numeric_limits<float>::infinity();
  return v;
}

// Runs plan p with the (uid, pointer) bindings and workspace; false (and p
// refused) when cuDNN says NOT_SUPPORTED.
bool execute(cudnnHandle_t h, FusedPlan& p, Dir dir, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* ws) {
  const cudnnStatus_t st = cudnn_graph::execute(h, p.plan, p.run, uids, ptrs, ws);
  if (st == CUDNN_STATUS_SUCCESS) return true;
  refuse_at_execution(p, dir, st);
  return false;
}

Shape4 shape_of(const Tensor& q) { return {q.size(0), q.size(1), q.size(2), q.size(3)}; }

}  // namespace

bool cudnn_attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                             Tensor& y, Tensor& lse) {
  if (!fused_enabled()) return false;
  for (const Tensor* t : {&q, &k, &v, static_cast<const Tensor*>(&y), static_cast<const Tensor*>(&lse)})
    if (!aligned(t->raw())) return false;
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());  // bound to ctx.compute() at creation
  const Shape4 s = shape_of(q);
  FusedPlan* p = get_plan(ctx, h, Dir::Forward, s, q.dtype());
  if (!p) return false;
  void* ws = p->workspace > 0 ? ctx.workspace(static_cast<size_t>(p->workspace)) : nullptr;
  float scale_v = scale, neg_inf = mask_value();
  const std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
  const std::vector<void*> ptrs{q.raw(), k.raw(), v.raw(), y.raw(), lse.raw(), &scale_v, &neg_inf};
  return execute(h, *p, Dir::Forward, uids, ptrs, ws);
}

bool cudnn_attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                              const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  if (!fused_enabled()) return false;
  for (const Tensor* t : {&q, &k, &v, &y, &lse, &dy, static_cast<const Tensor*>(&dq),
                          static_cast<const Tensor*>(&dk), static_cast<const Tensor*>(&dv)})
    if (!aligned(t->raw())) return false;
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());
  const Shape4 s = shape_of(q);
  FusedPlan* p = get_plan(ctx, h, Dir::Backward, s, q.dtype());
  if (!p) return false;
  // One workspace block: cuDNN's piece, then softmax_sum (B, H, T) and, unless
  // deterministic, dQ_accum (B, H, T, D), float32.
  const bool det = ctx.math.deterministic;
  const size_t cudnn_bytes = round_up(static_cast<size_t>(p->workspace));
  const size_t sum_bytes = round_up(static_cast<size_t>(s.b * s.h * s.t) * sizeof(float));
  const size_t acc_bytes = det ? 0 : static_cast<size_t>(s.b * s.h * s.t * s.d) * sizeof(float);
  char* base = static_cast<char*>(ctx.workspace(cudnn_bytes + sum_bytes + acc_bytes));
  void* ws = p->workspace > 0 ? base : nullptr;
  void* softmax_sum = base + cudnn_bytes;
  void* dq_accum = base + cudnn_bytes + sum_bytes;
  // cuDNN >= 9.6 initializes the accumulator itself (the frontend stopped
  // clearing it); clearing it here too costs one memset and removes the doubt.
  if (!det) FANOUT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, acc_bytes, detail::stream_of(ctx)));
  float scale_v = scale, neg_inf = mask_value(), one = 1.0f;
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kSoftmaxSum, kScale, kNegInf, kOne};
  std::vector<void*> ptrs{q.raw(), k.raw(), v.raw(), y.raw(), dy.raw(), lse.raw(), dq.raw(), dk.raw(),
                          dv.raw(), softmax_sum, &scale_v, &neg_inf, &one};
  if (!det) {
    uids.push_back(kDQAccum);
    ptrs.push_back(dq_accum);
  }
  return execute(h, *p, Dir::Backward, uids, ptrs, ws);
}

}  // namespace fanout::kernels::cuda
