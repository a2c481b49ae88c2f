// Batch normalization with the residual add and ReLU through cuDNN's fused
// normalization graphs (cuDNN's NormAddRelu and DReluForkDNorm patterns:
// cudnn-frontend's "SGBN add relu" and "DBN add relu" graphs, built here
// with the backend API of kernels/cuda/cudnn_graph.cuh). Called by
// kernels/cuda/batchnorm.cu, which runs its own kernels when these return
// false.
//
// Forward (training), x, z, y (N, C, H, W) stored channels-last in bfloat16
// or float16, per-channel tensors (1, C, 1, 1) float32:
//   b = NORM_FORWARD(x; gamma, beta, eps, momentum, running stats in and
//       out; saved mean and inverse standard deviation)    virtual, float32
//   s = b + z                     POINTWISE ADD (without z: s = b)
//   y = relu(s)                   POINTWISE RELU_FWD, stored in the I/O type
//   mask = y > 0                  POINTWISE CMP_GT with a by-value 0, BOOLEAN (a bit
//                                 per element), where the caller gives room and cuDNN
//                                 builds it
// Backward:
//   g  = dy * mask                POINTWISE MUL with the forward's mask, or
//   g  = dy where y > 0           POINTWISE RELU_BWD on y, without one -> g (real:
//                                 the fork, the residual's gradient; may be dy's memory)
//   dx, dgamma, dbeta = NORM_BACKWARD(x, saved mean, inverse std, g, gamma)
// Each direction tries the graph with the mask first (the frontend's "BN relu
// with mask" and "DBN add relu" shapes; with the residual add, the forward's
// is no sample's), then the one without.
// The statistics are cuDNN's float32 ones (not the float64 sums of the
// split kernels) and the sum is not rounded before the ReLU, so results
// differ from the split kernels' by roundings; running_var takes the
// unbiased variance, as PyTorch's.
//
// Plans: per (device, handle, direction, N, C, H, W, dtype, with z,
// deterministic, with the mask) the first heuristic engine that finalizes
// (mode A, then FALLBACK), built once outside the cache lock and kept for the life of the process, as
// kernels/cuda/attention_cudnn.cu keeps its. Any failure to build or run
// a graph (NOT_SUPPORTED or another error: fanout's kernels compute the
// same pass) refuses the key: logged once to stderr, and the next graph or
// the caller's kernels run for that shape from then on. Not applicable
// (false, nothing logged): float32 storage, a contiguous or non-4-D tensor,
// channels not a multiple of 8, mixed storages, operands not 16-byte
// aligned, a GPU below compute capability 8.0. FANOUT_BN_CUDNN=0 turns
// this path off.
#include "kernels/cuda/batchnorm_cudnn.cuh"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_graph.cuh"

namespace fanout::kernels::cuda {

namespace {

using namespace cudnn_graph;

enum Uid : int64_t {
  kX = 1, kZ, kY, kGamma, kBeta, kEps, kMomentum, kRunMeanIn, kRunVarIn, kRunMeanOut, kRunVarOut, kMean, kInvStd,
  kDY, kG, kDX, kDGamma, kDBeta, kMask, kZero,
  kFirstVirtual = 100
};

struct Nchw {
  int64_t n, c, h, w;
  Dims dims() const { return {n, c, h, w}; }
  Dims nhwc_strides() const { return {h * w * c, 1, w * c, c}; }
  Dims channel() const { return {1, c, 1, 1}; }
  Dims channel_strides() const { return {c, 1, c, c}; }
};

enum class Dir : int64_t { Forward = 0, Backward = 1 };

struct BnPlan {
  std::vector<Desc> keep;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  std::atomic<bool> refused{false};
  std::mutex run;
};

using PlanKey = std::array<int64_t, 11>;
using BnPlans = detail::PlanCache<PlanKey, BnPlan>;

// A per-channel float32 tensor of the graph.
cudnnBackendDescriptor_t channel_tensor(Graph& g, int64_t uid, const Nchw& s) {
  return g.tensor(uid, CUDNN_DATA_FLOAT, s.channel(), s.channel_strides(), false);
}

cudnnBackendDescriptor_t forward_graph(Graph& g, cudnnHandle_t h, const Nchw& s, bool with_z, bool with_mask) {
  const auto F = CUDNN_DATA_FLOAT;
  auto x = g.tensor(kX, g.io(), s.dims(), s.nhwc_strides(), false);
  auto y = g.tensor(kY, g.io(), s.dims(), s.nhwc_strides(), false);
  auto gamma = channel_tensor(g, kGamma, s), beta = channel_tensor(g, kBeta, s);
  auto mean = channel_tensor(g, kMean, s), invstd = channel_tensor(g, kInvStd, s);
  auto rm_in = channel_tensor(g, kRunMeanIn, s), rv_in = channel_tensor(g, kRunVarIn, s);
  auto rm_out = channel_tensor(g, kRunMeanOut, s), rv_out = channel_tensor(g, kRunVarOut, s);
  auto eps = g.scalar(kEps), momentum = g.scalar(kMomentum);
  auto b = g.virt(F, s.dims(), s.nhwc_strides());
  g.add_op(CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, x},
            {CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, mean},
            {CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, invstd},
            {CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, gamma},
            {CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, beta},
            {CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, eps},
            {CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC, momentum},
            {CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC, rm_in},
            {CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC, rv_in},
            {CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC, rm_out},
            {CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC, rv_out},
            {CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, b}},
           "the batch-norm forward operation", [](cudnnBackendDescriptor_t op) {
             const cudnnBackendNormMode_t mode = CUDNN_BATCH_NORM;
             const cudnnBackendNormFwdPhase_t phase = CUDNN_NORM_FWD_TRAINING;
             set(op, CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
             set(op, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE, CUDNN_TYPE_NORM_FWD_PHASE, 1, &phase);
           });
  cudnnBackendDescriptor_t pre = b;
  if (with_z) {
    auto z = g.tensor(kZ, g.io(), s.dims(), s.nhwc_strides(), false);
    pre = g.virt(F, s.dims(), s.nhwc_strides());
    g.pw2(CUDNN_POINTWISE_ADD, b, z, pre);
  }
  g.pw1(CUDNN_POINTWISE_RELU_FWD, pre, y);
  if (with_mask) {  // the ReLU's bit mask, y > 0, as the frontend's "BN relu with mask" writes it
    auto zero = g.scalar(kZero);  // a by-value 0, as the frontend's "layernorm bitmask relu" compares
    auto mask = g.tensor(kMask, CUDNN_DATA_BOOLEAN, s.dims(), s.nhwc_strides(), false);
    g.pointwise(CUDNN_POINTWISE_CMP_GT, F, y, zero, nullptr, mask);
  }
  return g.finish(h);
}

cudnnBackendDescriptor_t backward_graph(Graph& g, cudnnHandle_t h, const Nchw& s, bool with_mask) {
  auto x = g.tensor(kX, g.io(), s.dims(), s.nhwc_strides(), false);
  auto dy = g.tensor(kDY, g.io(), s.dims(), s.nhwc_strides(), false);
  auto gm = g.tensor(kG, g.io(), s.dims(), s.nhwc_strides(), false);
  auto dx = g.tensor(kDX, g.io(), s.dims(), s.nhwc_strides(), false);
  auto gamma = channel_tensor(g, kGamma, s), mean = channel_tensor(g, kMean, s);
  auto invstd = channel_tensor(g, kInvStd, s);
  auto dgamma = channel_tensor(g, kDGamma, s), dbeta = channel_tensor(g, kDBeta, s);
  if (with_mask) {  // dy times the forward's bit mask (the frontend's "DBN add relu")
    auto mask = g.tensor(kMask, CUDNN_DATA_BOOLEAN, s.dims(), s.nhwc_strides(), false);
    g.pw2(CUDNN_POINTWISE_MUL, dy, mask, gm);
  } else {  // ReLU backward on the stored output
    auto y = g.tensor(kY, g.io(), s.dims(), s.nhwc_strides(), false);
    g.pointwise(CUDNN_POINTWISE_RELU_BWD, CUDNN_DATA_FLOAT, y, dy, nullptr, gm);
  }
  g.add_op(CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR,
           {{CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, x},
            {CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC, mean},
            {CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, invstd},
            {CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, gm},
            {CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, gamma},
            {CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, dgamma},
            {CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, dbeta},
            {CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, dx}},
           "the batch-norm backward operation", [](cudnnBackendDescriptor_t op) {
             const cudnnBackendNormMode_t mode = CUDNN_BATCH_NORM;
             set(op, CUDNN_ATTR_OPERATION_NORM_BWD_MODE, CUDNN_TYPE_NORM_MODE, 1, &mode);
           });
  return g.finish(h);
}

// FANOUT_BN_CUDNN=0: never take this path.
bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FANOUT_BN_CUDNN");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

const char* dir_name(Dir d) { return d == Dir::Forward ? "forward" : "backward"; }

// The cached plan for the key, built on first use; nullptr when refused.
BnPlan* get_plan(Context& ctx, cudnnHandle_t h, Dir dir, const Nchw& s, DType dt, bool with_z, bool with_mask) {
  const bool det = ctx.math.deterministic;
  const PlanKey key{ctx.device().index, static_cast<int64_t>(ctx.id()),
                    static_cast<int64_t>(dir), s.n, s.c, s.h, s.w, static_cast<int64_t>(dt), with_z, det, with_mask};
  BnPlan& cached = BnPlans::instance().get(key, [&] {
    auto plan = std::make_unique<BnPlan>();
    const auto refuse = [&](const std::string& why) {
      std::fprintf(stderr,
                   "fanout: batch norm %s %s (N=%lld, C=%lld, H=%lld, W=%lld)%s%s%s: cuDNN's fused normalization "
                   "graph refused (%s); %s for this shape\n",
                   dir_name(dir), dtype_name(dt), static_cast<long long>(s.n), static_cast<long long>(s.c),
                   static_cast<long long>(s.h), static_cast<long long>(s.w), with_z ? " with the residual add" : "",
                   with_mask ? " with the ReLU's bit mask" : "", det ? " deterministic" : "", why.c_str(),
                   with_mask ? "trying the graph without the mask" : "running fanout's kernels");
      plan = std::make_unique<BnPlan>();
      plan->refused = true;
    };
    try {
      // Finalizing may load or compile kernels: not while another thread captures.
      ::fanout::detail::CaptureShared capture_safe;
      Graph g(plan->keep, dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, kFirstVirtual);
      cudnnBackendDescriptor_t graph =
          dir == Dir::Forward ? forward_graph(g, h, s, with_z, with_mask) : backward_graph(g, h, s, with_mask);
      const Plan p =
          first_plan(h, graph, plan->keep, det, std::string("batch norm ") + dir_name(dir), /*fallback=*/true);
      plan->plan = p.plan;
      plan->workspace = p.workspace;
    } catch (const Refused& r) {
      refuse(std::string(r.where) + ": " + cudnnGetErrorString(r.status));
    } catch (const Error& e) {
      // Any other failure to build these graphs refuses them too: fanout's
      // kernels compute the same pass (unlike attention, where a bad
      // argument is a bug to surface).
      refuse(e.what());
    }
    return plan;
  });
  return cached.refused ? nullptr : &cached;
}

bool run(Context& ctx, BnPlan& p, Dir dir, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs) {
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());
  void* ws = p.workspace > 0 ? ctx.workspace(static_cast<size_t>(p.workspace)) : nullptr;
  // NOT_SUPPORTED refuses the plan; any other status throws (a CUDA error
  // left by an earlier launch must surface here, not disable the graph).
  const cudnnStatus_t st = execute(h, p.plan, p.run, uids, ptrs, ws);
  if (st == CUDNN_STATUS_SUCCESS) return true;
  std::fprintf(stderr,
               "fanout: batch norm %s: cuDNN's fused normalization graph refused at execution (%s); running "
               "fanout's kernels for this shape from now on\n",
               dir_name(dir), cudnnGetErrorString(st));
  p.refused = true;
  return false;
}

// The shape and storage these graphs take (and whether they are on).
bool taken(const Tensor& x) {
  return enabled() && x.dim() == 4 && x.channels_last() && (x.dtype() == DType::BF16 || x.dtype() == DType::F16) &&
         x.size(1) % 8 == 0;  // cuDNN's fused batch norm engines take channels by 8
}

// Whether the tensors can go to cuDNN's graphs: 4-D, channels-last, all
// stored alike in bfloat16 or float16, 16-byte aligned, on a GPU of compute
// capability 8.0 or later.
bool applicable(const Context& ctx, std::initializer_list<const Tensor*> acts, std::initializer_list<const void*> ptrs) {
  const Tensor& first = **acts.begin();
  if (!taken(first)) return false;
  for (const Tensor* t : acts)
    if (t->dtype() != first.dtype() || t->format() != first.format() || t->shape() != first.shape()) return false;
  for (const void* p : ptrs)
    if (!aligned(p)) return false;
  // Each device's compute capability, asked once (a warm-up step asks first, before any capture).
  static std::array<std::atomic<int>, 64> majors{};
  const int dev = ctx.device().index;
  if (dev < 0 || dev >= static_cast<int>(majors.size())) return false;
  int major = majors[static_cast<size_t>(dev)].load(std::memory_order_relaxed);
  if (major == 0) {
    FANOUT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    majors[static_cast<size_t>(dev)].store(major, std::memory_order_relaxed);
  }
  return major >= 8;
}

Nchw nchw_of(const Tensor& x) { return {x.size(0), x.size(1), x.size(2), x.size(3)}; }

// Bytes of a bit mask of n elements (cuDNN's BOOLEAN tensors: 8 to a byte).
int64_t mask_bytes(int64_t n) { return (n + 7) / 8; }

bool usable_mask(const Tensor* mask, int64_t n) {
  return mask && mask->dtype() == DType::U8 && mask->numel() >= mask_bytes(n) && aligned(mask->raw());
}

}  // namespace

int64_t cudnn_bn_mask_bytes(const Tensor& x) { return taken(x) ? mask_bytes(x.numel()) : 0; }

bool cudnn_bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma,
                             const Tensor& beta, float eps, float momentum, Tensor& mean, Tensor& invstd,
                             Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor* mask, bool& mask_written) {
  mask_written = false;
  const bool ok = z ? applicable(ctx, {&x, z, &y},
                                 {x.raw(), z->raw(), y.raw(), gamma.raw(), beta.raw(), mean.raw(), invstd.raw(),
                                  running_mean.raw(), running_var.raw()})
                    : applicable(ctx, {&x, &y},
                                 {x.raw(), y.raw(), gamma.raw(), beta.raw(), mean.raw(), invstd.raw(),
                                  running_mean.raw(), running_var.raw()});
  // In place over x or z the graph's passes could read what it wrote.
  if (!ok || y.raw() == x.raw() || (z && y.raw() == z->raw())) return false;
  detail::DeviceScope scope(ctx);
  const Nchw s = nchw_of(x);
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());
  float eps_v = eps, momentum_v = momentum, zero_v = 0.0f;
  std::vector<int64_t> uids{kX, kY, kGamma, kBeta, kEps, kMomentum, kRunMeanIn, kRunVarIn, kRunMeanOut, kRunVarOut,
                            kMean, kInvStd};
  // The running statistics are updated in place (read, then written, per channel).
  std::vector<void*> ptrs{x.raw(), y.raw(), gamma.raw(), beta.raw(), &eps_v, &momentum_v, running_mean.raw(),
                          running_var.raw(), running_mean.raw(), running_var.raw(), mean.raw(), invstd.raw()};
  if (z) {
    uids.push_back(kZ);
    ptrs.push_back(z->raw());
  }
  // With the ReLU's bit mask for the backward when cuDNN builds and runs that graph, else without.
  bool ran = false;
  if (usable_mask(mask, x.numel())) {
    if (BnPlan* p = get_plan(ctx, h, Dir::Forward, s, x.dtype(), z != nullptr, true)) {
      uids.insert(uids.end(), {kZero, kMask});
      ptrs.insert(ptrs.end(), {&zero_v, mask->raw()});
      ran = mask_written = run(ctx, *p, Dir::Forward, uids, ptrs);
      uids.resize(uids.size() - 2);
      ptrs.resize(ptrs.size() - 2);
    }
  }
  if (!ran) {
    BnPlan* p = get_plan(ctx, h, Dir::Forward, s, x.dtype(), z != nullptr, false);
    if (!p || !run(ctx, *p, Dir::Forward, uids, ptrs)) return false;
  }
  // mean (2, C): cuDNN's mean is one float; the low part is zero.
  FANOUT_CUDA_CHECK(cudaMemsetAsync(static_cast<float*>(mean.raw()) + s.c, 0, sizeof(float) * static_cast<size_t>(s.c),
                                    detail::stream_of(ctx)));
  return true;
}

bool cudnn_bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                            const Tensor& invstd, const Tensor& gamma, const Tensor* mask, Tensor& grad_stats,
                            Tensor& g, Tensor& dx) {
  const int64_t c = x.dim() == 4 ? x.size(1) : 0;
  float* dbeta = grad_stats.f32();
  float* dgamma = dbeta + c;  // grad_stats (2, C): row 0 sum dy, row 1 sum dy * xhat
  if (!applicable(ctx, {&x, &y, &dy, &g, &dx},
                  {x.raw(), y.raw(), dy.raw(), g.raw(), dx.raw(), mean.raw(), invstd.raw(), gamma.raw(), dbeta,
                   dgamma}))
    return false;
  // Outputs over x or y: a later pass of the graph could read what it wrote (g over dy is safe: the
  // graph reads dy only to mask it, and masking twice is masking once).
  for (const void* out : {g.raw(), dx.raw()})
    if (out == x.raw() || out == y.raw()) return false;
  detail::DeviceScope scope(ctx);
  const Nchw s = nchw_of(x);
  auto h = static_cast<cudnnHandle_t>(ctx.cudnn());
  std::vector<int64_t> uids{kX, kDY, kG, kDX, kGamma, kMean, kInvStd, kDGamma, kDBeta};
  std::vector<void*> ptrs{x.raw(), dy.raw(), g.raw(), dx.raw(), gamma.raw(), mean.raw(), invstd.raw(), dgamma, dbeta};
  // The forward's bit mask where it wrote one and cuDNN builds that graph, else ReLU backward on y.
  if (usable_mask(mask, x.numel())) {
    if (BnPlan* p = get_plan(ctx, h, Dir::Backward, s, x.dtype(), false, true)) {
      uids.push_back(kMask);
      ptrs.push_back(mask->raw());
      if (run(ctx, *p, Dir::Backward, uids, ptrs)) return true;
      uids.pop_back();
      ptrs.pop_back();
    }
  }
  BnPlan* p = get_plan(ctx, h, Dir::Backward, s, x.dtype(), false, false);
  if (!p) return false;
  uids.push_back(kY);
  ptrs.push_back(y.raw());
  return run(ctx, *p, Dir::Backward, uids, ptrs);
}

}  // namespace fanout::kernels::cuda
