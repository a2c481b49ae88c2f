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

namespace fanout::kernels::cuda {

namespace {

constexpr int64_t kAlignBytes = 16;                    // every real tensor's declared alignment
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;  // an engine wanting more is skipped
constexpr size_t kCarve = 256;                         // our scratch pieces start aligned

// A cuDNN status of the NOT_SUPPORTED family (3000..3999).
bool not_supported(cudnnStatus_t st) { return CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED; }

// Thrown while building when cuDNN says NOT_SUPPORTED; caught by get_plan.
struct Refused {
  cudnnStatus_t status;
  std::string where;
};

// Finalizes d: NOT_SUPPORTED becomes Refused, any other error throws.
void finalize(cudnnBackendDescriptor_t d, const char* what) {
  const cudnnStatus_t st = cudnnBackendFinalize(d);
  if (st == CUDNN_STATUS_SUCCESS) return;
  if (not_supported(st)) throw Refused{st, std::string("finalizing ") + what};
  FANOUT_CUDNN_CHECK(st);  // throws with the expression, file, line and cuDNN's message
}

// An owned backend descriptor; destruction never throws.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t t) { FANOUT_CUDNN_CHECK(cudnnBackendCreateDescriptor(t, &d_)); }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&&) = delete;
  Desc(const Desc&) = delete;
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
         const void* v) {
  FANOUT_CUDNN_CHECK(cudnnBackendSetAttribute(d, a, t, n, v));
}
void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
  set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

using Dims = std::array<int64_t, 4>;

// Unique ids of the tensors the caller binds at execution.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum,
  kFirstVirtual = 100
};

// Builds one operation graph; every descriptor it makes lives in `keep`.
class Graph {
 public:
  Graph(std::vector<Desc>& keep, cudnnDataType_t io) : keep_(keep), io_(io) {}

  cudnnDataType_t io() const { return io_; }

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                                  bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = kAlignBytes;
    const bool v = is_virtual, bv = by_value;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    finalize(t, "a tensor descriptor");
    return t;
  }
  // A virtual intermediate.
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, dt, dims, strides, true);
  }
  // A by-value float32 scalar (its value is bound at execution).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]) computed in `prec`; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "a pointwise descriptor");
    add_op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw}, {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
            {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b}, {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
            {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}},
           "a pointwise operation");
  }
  void pw1(cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    pointwise(m, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  void pw2(cudnnPointwiseMode_t m, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
           cudnnBackendDescriptor_t y) {
    pointwise(m, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }

  void reduction(cudnnReduceTensorOp_t op_kind, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &op_kind);
    set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    finalize(r, "a reduction descriptor");
    add_op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x}, {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
            {CUDNN_ATTR_OPERATION_REDUCTION_DESC, r}},
           "a reduction operation");
  }

  // c = a b (batched over the first two dims), float32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    finalize(mm, "a matmul descriptor");
    add_op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a}, {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
            {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c}, {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}},
           "a matmul operation");
  }

  // y: x's memory under other dims and strides (a transpose view).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    add_op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}}, "a reshape operation");
  }

  // The finalized operation graph of every operation added.
  cudnnBackendDescriptor_t finish(cudnnHandle_t h) {
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data());
    finalize(g, "the operation graph");
    return g;
  }

 private:
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    keep_.emplace_back(t);
    return keep_.back().get();
  }
  // A finalized operation of `type` with these descriptor attributes (null ones left out).
  void add_op(cudnnBackendDescriptorType_t type,
              std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attrs,
              const char* what) {
    cudnnBackendDescriptor_t op = make(type);
    for (const auto& [name, desc] : attrs)
      if (desc) set_desc(op, name, desc);
    finalize(op, what);
    ops_.push_back(op);
  }

  std::vector<Desc>& keep_;
  cudnnDataType_t io_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
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

cudnnBackendDescriptor_t backward_graph(Graph& g, cudnnHandle_t h, const Shape4& s) {
  const auto F = CUDNN_DATA_FLOAT;
  const auto [q, kt, o, stats, scale, neg_inf] = pass_tensors(g, s);
  auto vt = g.tensor(kV, g.io(), s.kt(), s.kt_strides(), false);
  auto d_o = g.tensor(kDO, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dq = g.tensor(kDQ, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dk = g.tensor(kDK, g.io(), s.qkv(), s.qkv_strides(), false);
  auto dv = g.tensor(kDV, g.io(), s.qkv(), s.qkv_strides(), false);
  auto softmax_sum = g.tensor(kSoftmaxSum, F, s.rows(), s.rows_strides(), false);
  auto dq_accum = g.tensor(kDQAccum, F, s.qkv(), s.qkv_strides(), false);
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

  // dQ = dS K, through the float32 accumulator
  auto k = g.virt(g.io(), s.qkv(), s.qkv_strides());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pw1(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
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

bool has_note(cudnnBackendDescriptor_t cfg, std::vector<Desc>& keep, cudnnBackendNumericalNote_t note) {
  keep.emplace_back(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t engine = keep.back().get();
  int64_t n = 0;
  FANOUT_CUDNN_CHECK(
      cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine));
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  FANOUT_CUDNN_CHECK(cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                              static_cast<int64_t>(notes.size()), &n, notes.data()));
  for (int64_t i = 0; i < n; ++i)
    if (notes[static_cast<size_t>(i)] == note) return true;
  return false;
}

// The graph for (dir, s, io) and the first heuristic engine that finalizes;
// throws Refused when cuDNN supports none.
std::unique_ptr<FusedPlan> build_plan(cudnnHandle_t h, Dir dir, const Shape4& s, cudnnDataType_t io,
                                      bool deterministic) {
  auto fp = std::make_unique<FusedPlan>();
  Graph g(fp->keep, io);
  cudnnBackendDescriptor_t graph = dir == Dir::Forward ? forward_graph(g, h, s) : backward_graph(g, h, s);

  fp->keep.emplace_back(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendDescriptor_t heur = fp->keep.back().get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heur, "the engine heuristics");
  int64_t count = 0;
  FANOUT_CUDNN_CHECK(
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  if (count <= 0) throw Refused{CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine for the graph"};
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < count; ++i) {
    fp->keep.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfgs.push_back(fp->keep.back().get());
  }
  int64_t got = 0;
  FANOUT_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                              count, &got, cfgs.data()));
  // Engines in the heuristics' order: skip one that cannot take the graph
  // (NOT_SUPPORTED) or fails to finalize otherwise (the next computes the
  // same graph); when none finalizes, an error other than NOT_SUPPORTED is
  // thrown, else the graph is refused.
  Refused last{CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine finalizes"};
  cudnnStatus_t error = CUDNN_STATUS_SUCCESS;  // the first failure not NOT_SUPPORTED
  for (int64_t i = 0; i < got; ++i) {
    cudnnBackendDescriptor_t cfg = cfgs[static_cast<size_t>(i)];
    if (deterministic && has_note(cfg, fp->keep, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
      last = Refused{CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no deterministic engine"};
      continue;
    }
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    set(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    set_desc(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    const cudnnStatus_t st = cudnnBackendFinalize(plan.get());
    if (st != CUDNN_STATUS_SUCCESS) {
      if (not_supported(st))
        last = Refused{st, "finalizing an execution plan (every heuristic engine)"};
      else if (error == CUDNN_STATUS_SUCCESS)
        error = st;
      continue;
    }
    int64_t ws = 0, n = 0;
    FANOUT_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                CUDNN_TYPE_INT64, 1, &n, &ws));
    if (ws < 0 || static_cast<size_t>(ws) > kMaxWorkspaceBytes) {
      last = Refused{CUDNN_STATUS_NOT_SUPPORTED, "every engine wants more than 1 GiB of workspace"};
      continue;
    }
    fp->workspace = ws;
    fp->keep.push_back(std::move(plan));
    fp->plan = fp->keep.back().get();
    return fp;
  }
  if (error != CUDNN_STATUS_SUCCESS)
    FANOUT_FAIL() << "attention " << (dir == Dir::Forward ? "forward" : "backward")
                  << ": no cuDNN engine of the fused attention graph finalizes; the first error: "
                  << cudnnGetErrorString(error);
  throw last;
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
  // The handle is part of the key: a plan is finalized against its handle and
  // only ever runs with it (one context's, on one worker thread).
  const PlanKey key{ctx.device().index, static_cast<int64_t>(reinterpret_cast<uintptr_t>(h)),
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

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignBytes == 0; }

size_t round_up(size_t n) { return (n + kCarve - 1) / kCarve * kCarve; }

// Runs plan p with the given (uid, pointer) bindings and workspace; false
// (and p refused) when cuDNN says NOT_SUPPORTED.
bool execute(cudnnHandle_t h, FusedPlan& p, Dir dir, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, void* ws) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
      uids.data());
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()),
      ptrs.data());
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  FANOUT_CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  cudnnStatus_t st;
  {
    std::lock_guard<std::mutex> lock(p.run);
    st = cudnnBackendExecute(h, p.plan, pack.get());
  }
  if (not_supported(st)) {
    refuse_at_execution(p, dir, st);
    return false;
  }
  FANOUT_CUDNN_CHECK(st);
  return true;
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
  float scale_v = scale, neg_inf = -std::numeric_limits<float>::infinity();
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
  // One workspace block: cuDNN's piece, then softmax_sum (B, H, T) and dQ_accum (B, H, T, D), float32.
  const size_t cudnn_bytes = round_up(static_cast<size_t>(p->workspace));
  const size_t sum_bytes = round_up(static_cast<size_t>(s.b * s.h * s.t) * sizeof(float));
  const size_t acc_bytes = static_cast<size_t>(s.b * s.h * s.t * s.d) * sizeof(float);
  char* base = static_cast<char*>(ctx.workspace(cudnn_bytes + sum_bytes + acc_bytes));
  void* ws = p->workspace > 0 ? base : nullptr;
  void* softmax_sum = base + cudnn_bytes;
  void* dq_accum = base + cudnn_bytes + sum_bytes;
  // cuDNN >= 9.6 initializes the accumulator itself (the frontend stopped
  // clearing it); clearing it here too costs one memset and removes the doubt.
  FANOUT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, acc_bytes, detail::stream_of(ctx)));
  float scale_v = scale, neg_inf = -std::numeric_limits<float>::infinity(), one = 1.0f;
  const std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV,
                                  kSoftmaxSum, kDQAccum, kScale, kNegInf, kOne};
  const std::vector<void*> ptrs{q.raw(), k.raw(), v.raw(), y.raw(), dy.raw(), lse.raw(), dq.raw(), dk.raw(),
                                dv.raw(), softmax_sum, dq_accum, &scale_v, &neg_inf, &one};
  return execute(h, *p, Dir::Backward, uids, ptrs, ws);
}

}  // namespace fanout::kernels::cuda
