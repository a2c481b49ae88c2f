// Per-device execution context: one per device worker. Every kernel call takes
// it. Holds the device, its streams, library handles, a grow-only workspace,
// the RNG, the training flag and the gradient-ready callback.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace fanout {

struct MathOptions {
  bool allow_tf32 = false;     // matrix products and convolutions on CUDA
  bool cudnn_benchmark = false;
  bool deterministic = false;
  // CPU only: results independent of how a batch is split over replicas.
  // Per-row products use a fixed summation order (not a GEMM library's,
  // whose order depends on the row count), and weight gradients accumulate each sample's
  // float contribution in float64 (see Module::set_grad_dtype).
  bool split_invariant = false;
  // Mixed precision: BF16 or F16 runs the layers under autocast's rules in
  // that type (runtime/nn/autocast.h); F32: off.
  DType autocast = DType::F32;
  // CPU: the threads one kernel call may use (oneDNN's OpenMP team). 0: every
  // core, or OMP_NUM_THREADS (kernel_thread_budget()); engines give each
  // replica its share. The summation
  // order of a threaded kernel depends on it, so runs agree bit for bit only
  // at the same count (split-invariant math uses 1).
  int cpu_threads = 0;
};

// What a backend keeps per context beyond handles (oneDNN's engine, stream
// and primitives on CPU devices): made by the backend on first use, destroyed
// with the context.
struct BackendState {
  virtual ~BackendState() = default;
};

// Activation checkpointing's buffers (models/layers/checkpointed.h): while
// a checkpointed block runs, the k-th activation buffer its layers ask for
// (ensure(t, s, ctx)) is the k-th of these, shared by every checkpointed
// block of one replica. Each grows to the largest request it sees, so after
// warm-up binding allocates nothing.
class ActivationSlots {
 public:
  void restart() { next_ = 0; }
  void bind(Tensor& t, const Shape& s, DType dt, Device d, MemoryFormat f);
  // The gradient a checkpointed block receives, copied out of the slots
  // (the next block's input gradient lives in them).
  Tensor& grad_in() { return grad_in_; }
  size_t bytes() const;

 private:
  std::vector<Tensor> slots_;
  size_t next_ = 0;
  Tensor grad_in_;
};

class Context {
 public:
  explicit Context(Device d, uint64_t seed = 0);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  Stream& compute() { return *compute_; }
  Stream& copy() { return *copy_; }
  Stream& comm() { return *comm_; }

  bool training = true;
  MathOptions math;
  // CPU kernels' threads on a context whose work runs on threads that exist
  // already (DataParallel's optimizer step on its idle replica workers, so
  // that no team of its own stays awake beside them): cpu_workers(fn) runs
  // fn(w) for w in [0, cpu_worker_count) on those threads, the calling
  // one's included, and returns when all are done; each takes its share of
  // math.cpu_threads on its own OpenMP team. Unset: the calling thread's team.
  std::function<void(const std::function<void(int)>&)> cpu_workers;
  int cpu_worker_count = 0;
  // The batch row this context's first row is (a DataParallel replica's
  // offset in the user's batch), so errors name the user's rows.
  int64_t first_row = 0;
  // Counter-based randomness (Dropout): the training pass's key, the same on
  // every replica and process, and which rows of the whole batch this
  // context's rows are (row n: random_row + n * random_row_stride; a DDP
  // rank's rows are every world-th, as DistributedSampler deals them), so
  // that how a batch is split does not change what is drawn. Engines set
  // them before each training forward.
  uint64_t pass_key = 0;
  int64_t random_row = 0, random_row_stride = 1;
  // Counts the keys layers drew from pass_key: a step captured into a CUDA
  // graph would replay its first key, so an engine captures no step that draws.
  uint64_t random_draws = 0;

  // What a layer changes on the host in a training step (BatchNorm's
  // num_batches_tracked): done at once, or, while the step is captured into
  // a CUDA graph (runtime/parallel/step_graph.h), kept and done after each
  // launch of the graph instead.
  void host_effect(const std::function<void()>& fn) {
    if (captured_effects) captured_effects->push_back(fn);
    else fn();
  }
  std::vector<std::function<void()>>* captured_effects = nullptr;

  // Set by a checkpointed block around its forward and its recomputation:
  // layers' activation buffers come from these slots.
  ActivationSlots* slots = nullptr;
  // True while a checkpointed block recomputes its forward in backward:
  // BatchNorm neither updates its running statistics nor all-reduces again.
  bool recomputing = false;
  // This context's activation slots (made on first use).
  ActivationSlots& checkpoint_slots();

  std::mt19937_64& rng() { return rng_; }
  void seed(uint64_t s) { rng_.seed(s); }

  // Scratch memory of at least `bytes` on this device; grows, never shrinks.
  // Valid until the next call that grows it.
  void* workspace(size_t bytes);
  size_t workspace_size() const { return workspace_.defined() ? workspace_.nbytes() : 0; }
  // Per role (0 to kStagingRoles - 1), scratch of at least `bytes` for the
  // kernel entry points that stage operands in float32 (kernels/staging.h);
  // grows, never shrinks, so a warm step allocates nothing. Valid until the
  // next call for the same role that grows it. The last role is autocast's
  // weight-gradient sink (runtime/nn/autocast.h), live across a layer's
  // backward kernels.
  static constexpr int kStagingRoles = 9;
  static constexpr int kGradSinkRole = kStagingRoles - 1;
  const Tensor& staging(int role, size_t bytes);
  size_t staging_size() const;
  // Counts the times this context's kept scratch (workspace, staging, a
  // backend's buffers) was reallocated, on any thread: a captured step that
  // points at scratch is stale once it moves.
  uint64_t scratch_moves() const { return scratch_moves_.load(std::memory_order_relaxed); }
  void scratch_moved() { scratch_moves_.fetch_add(1, std::memory_order_relaxed); }

  // Library handles, created on first use (CUDA only; null on CPU).
  void* cublas();
  void* cudnn();
  // Unique in the process, never reused: a cache of plans built with this
  // context's handles keys on it (a later context's handle may reuse the
  // address of a destroyed one).
  uint64_t id() const { return id_; }
  // Expires when this context is destroyed: an object kept beside it (an
  // optimizer given an engine's context) checks it before each use.
  std::weak_ptr<const void> lifetime() const { return alive_; }
  // The backend's per-context state, or null before it made one.
  BackendState* backend_state() { return backend_state_.get(); }
  void set_backend_state(std::unique_ptr<BackendState> s) { backend_state_ = std::move(s); }

  // Called by layers when a parameter range of the gradient arena holds its
  // final value for this backward pass: [begin, begin + count) in floats.
  std::function<void(size_t begin, size_t count)> on_grad_ready;
  void grad_ready(size_t begin, size_t count) {
    if (on_grad_ready) on_grad_ready(begin, count);
  }
  // Called before a layer first writes (+=) the gradients of a parameter
  // range this pass, so that an engine keeping gradients in flight only
  // (ZeRO-2) can give the range memory first.
  std::function<void(size_t begin, size_t count)> on_grad_write;
  void grad_write(size_t begin, size_t count) {
    if (on_grad_write) on_grad_write(begin, count);
  }

 private:
  Device device_;
  std::unique_ptr<Stream> compute_, copy_, comm_;
  std::mt19937_64 rng_;
  Tensor workspace_;
  Tensor staging_[kStagingRoles];
  void* cublas_ = nullptr;
  void* cudnn_ = nullptr;
  uint64_t id_;
  std::atomic<uint64_t> scratch_moves_{0};
  std::unique_ptr<BackendState> backend_state_;
  std::unique_ptr<ActivationSlots> checkpoint_slots_;
  std::shared_ptr<const int> alive_ = std::make_shared<const int>(0);
};

// A layer's activation buffer: ensure(t, s, dt, ctx.device(), f), or inside
// a checkpointed block the context's next shared slot. Layers keep state
// that must outlive a recomputation (BatchNorm's batch statistics, constants
// written once) with the device form instead.
void ensure(Tensor& t, const Shape& s, DType dt, Context& ctx, MemoryFormat f = MemoryFormat::Contiguous);
inline void ensure(Tensor& t, const Shape& s, Context& ctx) { ensure(t, s, DType::F32, ctx); }
// A tensor's shape, dtype and format, kept to size another like it later
// (an input gradient like the input).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::F32;
  MemoryFormat format = MemoryFormat::Contiguous;
  TensorSpec() = default;
  explicit TensorSpec(const Tensor& t) : shape(t.shape()), dtype(t.dtype()), format(t.format()) {}
  void ensure(Tensor& t, Context& ctx) const;
};

// An activation buffer like `like`: its shape, dtype and format.
inline void ensure_like(Tensor& t, const Tensor& like, Context& ctx) {
  ensure(t, like.shape(), like.dtype(), ctx, like.format());
}
inline void TensorSpec::ensure(Tensor& t, Context& ctx) const { fanout::ensure(t, shape, dtype, ctx, format); }

namespace backend {
void* cublas_create(int device, void* stream);
void cublas_destroy(int device, void* h) noexcept;
void* cudnn_create(int device, void* stream);
void cudnn_destroy(int device, void* h) noexcept;
}  // namespace backend

}  // namespace fanout
