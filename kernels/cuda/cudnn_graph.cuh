// What the CUDA kernels that run cuDNN operation graphs through the backend
// API (cudnn_graph.h) share: owned descriptors, attribute setters, a graph
// builder (tensors; pointwise, reduction, matmul and reshape operations;
// any other operation by its attributes), the first heuristic engine that finalizes, and execution.
// kernels/cuda/attention_cudnn.cu (fused flash attention) and
// kernels/cuda/batchnorm_cudnn.cu (batch norm with the residual add and
// ReLU) build their graphs with it.
//
// Refusal: a status of cuDNN's NOT_SUPPORTED category while finalizing
// throws Refused (the caller remembers the shape as refused, logs once and
// runs its own kernels); any other cuDNN error throws Error through
// FANOUT_CUDNN_CHECK: a bad argument is a bug, never a silent fallback.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda::cudnn_graph {

constexpr int64_t kAlignBytes = 16;                    // every real tensor's declared alignment
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;  // an engine wanting more is skipped

// A cuDNN status of the NOT_SUPPORTED family (3000..3999).
inline bool not_supported(cudnnStatus_t st) { return CUDNN_STATUS_CATEGORY(st) == CUDNN_STATUS_NOT_SUPPORTED; }

// Thrown while building when cuDNN says NOT_SUPPORTED.
struct Refused {
  cudnnStatus_t status;
  std::string where;
};

// Finalizes d: NOT_SUPPORTED becomes Refused, any other error throws.
inline void finalize(cudnnBackendDescriptor_t d, const char* what) {
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

inline void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n,
                const void* v) {
  FANOUT_CUDNN_CHECK(cudnnBackendSetAttribute(d, a, t, n, v));
}
inline void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
  set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

using Dims = std::array<int64_t, 4>;

// Builds one operation graph; every descriptor it makes lives in `keep`.
class Graph {
 public:
  Graph(std::vector<Desc>& keep, cudnnDataType_t io, int64_t first_virtual)
      : keep_(keep), io_(io), next_virtual_(first_virtual) {}

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
  // A by-value scalar of type dt (its value is bound at execution).
  cudnnBackendDescriptor_t scalar(int64_t uid, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(uid, dt, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b][, t]) computed in `prec`; axis for GEN_INDEX. A
  // backward mode (RELU_BWD) takes dy as b and writes dx as y.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    if (mode == CUDNN_POINTWISE_RELU_FWD || mode == CUDNN_POINTWISE_RELU_BWD) {
      // A plain ReLU stated in full, as the frontend's builder does: NaN
      // propagated (an attribute cuDNN 9 deprecates: set where still taken),
      // clipped to [0, FLT_MAX] (float math), slope 0 below.
      const cudnnNanPropagation_t nan = CUDNN_PROPAGATE_NAN;
      (void)cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_NAN_PROPAGATION, CUDNN_TYPE_NAN_PROPOGATION, 1, &nan);
      const double lower = 0.0, upper = std::numeric_limits<float>::max(), slope = 0.0;
      set(pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lower);
      set(pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &upper);
      set(pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &slope);
    }
    finalize(pw, "a pointwise descriptor");
    if (mode == CUDNN_POINTWISE_RELU_BWD) {
      add_op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
             {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw}, {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
              {CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, b}, {CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, y}},
             "a pointwise backward operation");
      return;
    }
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

  // A finalized operation of `type`: its descriptor attributes (null ones
  // left out), then `more(op)` for the others (modes, lists).
  template <class More>
  void add_op(cudnnBackendDescriptorType_t type,
              std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attrs,
              const char* what, More&& more) {
    cudnnBackendDescriptor_t op = make(type);
    for (const auto& [name, desc] : attrs)
      if (desc) set_desc(op, name, desc);
    more(op);
    finalize(op, what);
    ops_.push_back(op);
  }
  void add_op(cudnnBackendDescriptorType_t type,
              std::initializer_list<std::pair<cudnnBackendAttributeName_t, cudnnBackendDescriptor_t>> attrs,
              const char* what) {
    add_op(type, attrs, what, [](cudnnBackendDescriptor_t) {});
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

  std::vector<Desc>& keep_;
  cudnnDataType_t io_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_;
};

// Whether engine config cfg carries the numerical note.
inline bool has_note(cudnnBackendDescriptor_t cfg, std::vector<Desc>& keep, cudnnBackendNumericalNote_t note) {
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

// A finalized execution plan and its workspace (bytes), kept in `keep`.
struct Plan {
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
};

// The engine configurations cuDNN's heuristics in `mode` offer for `graph`
// (kept in `keep`); none when that mode has none.
inline std::vector<cudnnBackendDescriptor_t> heuristic_configs(cudnnBackendDescriptor_t graph,
                                                               std::vector<Desc>& keep, cudnnBackendHeurMode_t mode) {
  keep.emplace_back(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendDescriptor_t heur = keep.back().get();
  set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  finalize(heur, "the engine heuristics");
  int64_t count = 0;
  FANOUT_CUDNN_CHECK(
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < count; ++i) {
    keep.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    cfgs.push_back(keep.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    FANOUT_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                count, &got, cfgs.data()));
  cfgs.resize(static_cast<size_t>(std::max<int64_t>(0, got)));
  return cfgs;
}

// The first engine for `graph` that finalizes, of cuDNN's heuristics in
// mode A and then, with `fallback`, in mode FALLBACK; with `deterministic`
// the first without the NONDETERMINISTIC note. An engine that cannot take
// the graph (NOT_SUPPORTED) or fails to finalize otherwise is skipped (the
// next computes the same graph); when none finalizes, an error other than
// NOT_SUPPORTED throws Error naming `what`, else Refused.
inline Plan first_plan(cudnnHandle_t h, cudnnBackendDescriptor_t graph, std::vector<Desc>& keep, bool deterministic,
                       const std::string& what, bool fallback = false) {
  std::vector<cudnnBackendDescriptor_t> cfgs;
  try {
    cfgs = heuristic_configs(graph, keep, CUDNN_HEUR_MODE_A);
  } catch (const Refused&) {  // mode A has nothing for this graph: FALLBACK's engines may
    if (!fallback) throw;
  }
  if (fallback) {
    try {
      const std::vector<cudnnBackendDescriptor_t> more = heuristic_configs(graph, keep, CUDNN_HEUR_MODE_FALLBACK);
      cfgs.insert(cfgs.end(), more.begin(), more.end());
    } catch (const Refused&) {  // no fallback heuristics for this graph: mode A's engines only
    } catch (const Error&) {    // nor when the fallback query itself fails: mode A's engines may still run
    }
  }
  if (cfgs.empty()) throw Refused{CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine for the graph"};
  const int64_t got = static_cast<int64_t>(cfgs.size());
  Refused last{CUDNN_STATUS_NOT_SUPPORTED, "heuristics: no engine finalizes"};
  cudnnStatus_t error = CUDNN_STATUS_SUCCESS;  // the first failure not NOT_SUPPORTED
  for (int64_t i = 0; i < got; ++i) {
    cudnnBackendDescriptor_t cfg = cfgs[static_cast<size_t>(i)];
    if (deterministic && has_note(cfg, keep, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
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
    keep.push_back(std::move(plan));
    return Plan{keep.back().get(), ws};
  }
  if (error != CUDNN_STATUS_SUCCESS)
    FANOUT_FAIL() << what << ": no cuDNN engine of the graph finalizes; the first error: "
                  << cudnnGetErrorString(error);
  throw last;
}

// Runs `plan` with the (uid, pointer) bindings and workspace, one execution
// of the plan at a time (`run`); returns cuDNN's status when it is of the
// NOT_SUPPORTED category outside a stream capture (the caller refuses the
// plan from then on), CUDNN_STATUS_SUCCESS otherwise; any other error, and
// a refusal inside a capture, throws.
inline cudnnStatus_t execute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, std::mutex& run,
                             const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* ws) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
      uids.data());
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()),
      ptrs.data());
  set(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  FANOUT_CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  cudnnStatus_t st;
  {
    std::lock_guard<std::mutex> lock(run);
    st = cudnnBackendExecute(h, plan, pack.get());
  }
  if (not_supported(st)) {
    // Inside a captured step a refusal may be the capture's, not the shape's:
    // fail the capture (the step then runs plainly) instead of refusing the plan.
    cudaStream_t stream = nullptr;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudnnGetStream(h, &stream) == CUDNN_STATUS_SUCCESS && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
        capture != cudaStreamCaptureStatusNone)
      FANOUT_FAIL() << "cuDNN refused an execution plan inside a captured step (" << cudnnGetErrorString(st) << ")";
    return st;
  }
  FANOUT_CUDNN_CHECK(st);
  return CUDNN_STATUS_SUCCESS;
}

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlignBytes == 0; }

}  // namespace fanout::kernels::cuda::cudnn_graph
