// DDP engine.
#include "runtime/parallel/distributed.h"

#include "kernels/gemm.h"
#include "runtime/core/error.h"

namespace fanout {

namespace {
// Gloo tags: the communication thread and the calling thread each run their
// collectives in program order, and the two may overlap.
constexpr uint32_t kTagMain = 1, kTagGrads = 2;

DataParallelOptions ddp_dp_options(DataParallelOptions o) {
  o.require_all_grads = true;  // DDP refuses a step in which a parameter got no gradient
  return o;
}
}  // namespace

DistributedDataParallelEngine::DistributedDataParallelEngine(Module& model, const std::vector<Device>& devices,
                                                             const Criterion& criterion, const DdpOptions& opts,
                                                             std::unique_ptr<dist::ProcessGroup> group)
    : group_(std::move(group)), inner_(model, devices, criterion, ddp_dp_options(opts.dp)), opts_(opts) {
  FANOUT_CHECK(group_) << "DDP needs a process group";
  host_group_ = group_->backend() == "gloo";
  const Device primary = devices.at(0);
  if (primary.is_cpu())
    kernels::set_cpu_blas_threads(
        cpu_blas_threads(static_cast<int>(devices.size()), opts.dp.math, std::max(1, opts.local_processes)));
  // Start from rank 0's state.
  Arenas& a = inner_.model().arenas();
  broadcast(a.params, "broadcast of the initial parameters", kTagMain);
  if (a.buffers.numel() > 0) broadcast(a.buffers, "broadcast of the initial buffers", kTagMain);
  data_parallel().set_cross_process(this);
  ready_.assign(data_parallel().num_buckets(), 0);
  if (host_group_ && primary.is_cpu()) comm_thread_ = std::thread([this] { comm_loop(); });
}

DistributedDataParallelEngine::~DistributedDataParallelEngine() {
  bool busy;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    busy = busy_;
  }
  cv_.notify_all();
  if (comm_thread_.joinable()) {
    if (busy) {
      // A collective is in flight after a failure elsewhere; it cannot be
      // interrupted and may wait for its timeout. Leave the thread, and the
      // group it uses, to the process's exit instead of blocking here.
      comm_thread_.detach();
      group_.release();
    } else {
      comm_thread_.join();
    }
  }
  data_parallel().set_cross_process(nullptr);
}

void DistributedDataParallelEngine::broadcast(Tensor& t, const std::string& what, uint32_t tag) {
  const bool host = t.device().is_cpu();
  Context& ctx = primary_context();
  if (host == host_group_) {
    // The group runs on its own stream: what the compute stream still writes into t comes first.
    if (!host) ctx.compute().synchronize();
    return group_->broadcast(t, 0, what, tag);
  }
  ensure(staging_, t.shape(), t.dtype(), host_group_ ? Device::cpu() : ctx.device());
  Tensor s = staging_.flat(0, t.shape());
  s.copy_from(t, &ctx.compute());
  ctx.compute().synchronize();
  group_->broadcast(s, 0, what, tag);
  t.copy_from(s, &ctx.compute());
  ctx.compute().synchronize();
}

void DistributedDataParallelEngine::all_reduce(Tensor& t, const std::string& what, uint32_t tag) {
  const bool host = t.device().is_cpu();
  Context& ctx = primary_context();
  if (host == host_group_) {
    if (!host) ctx.compute().synchronize();  // as in broadcast
    return group_->all_reduce(t, what, tag);
  }
  ensure(staging_, t.shape(), t.dtype(), host_group_ ? Device::cpu() : ctx.device());
  Tensor s = staging_.flat(0, t.shape());
  s.copy_from(t, &ctx.compute());
  ctx.compute().synchronize();
  group_->all_reduce(s, what, tag);
  t.copy_from(s, &ctx.compute());
  ctx.compute().synchronize();
}

void DistributedDataParallelEngine::reduce_bucket(int b) {
  const GradBucket& bk = data_parallel().buckets().buckets()[b];
  Tensor g = inner_.model().arenas().grads.flat(bk.begin, Shape{bk.count});
  all_reduce(g, "all-reduce of gradient bucket " + std::to_string(b), kTagGrads);
}

void DistributedDataParallelEngine::bucket_reduced(int b) {
  if (!sync_ || !comm_thread_.joinable()) return;  // no_sync, or reduced after backward (device memory)
  {
    std::lock_guard<std::mutex> g(mu_);
    ready_[b] = 1;
  }
  cv_.notify_all();
}

void DistributedDataParallelEngine::comm_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (next_ >= 0 && ready_[next_]); });
    if (stop_) return;
    const int b = next_;
    busy_ = true;
    lk.unlock();
    std::exception_ptr err;
    try {
      reduce_bucket(b);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    busy_ = false;
    if (err) {
      comm_error_ = err;
      next_ = -1;
    } else {
      --next_;
    }
    if (next_ < 0) cv_.notify_all();
  }
}

StepResult DistributedDataParallelEngine::forward_backward(const Tensor& x, const Tensor& y, float grad_scale,
                                                           bool sync) {
  if (opts_.broadcast_buffers) broadcast_buffers();
  sync_ = sync;
  const int nb = data_parallel().num_buckets();
  if (comm_thread_.joinable()) {
    std::lock_guard<std::mutex> g(mu_);
    std::fill(ready_.begin(), ready_.end(), 0);
    comm_error_ = nullptr;
    next_ = sync ? nb - 1 : -1;
  }
  StepResult r;
  try {
    r = inner_.forward_backward(x, y, grad_scale, sync);
  } catch (...) {
    // Backward failed: the buckets it never reduced will not come; stop waiting for them.
    std::lock_guard<std::mutex> g(mu_);
    next_ = -1;
    throw;
  }
  if (!sync) return r;
  if (comm_thread_.joinable()) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return next_ < 0; });
    if (comm_error_) std::rethrow_exception(comm_error_);
  } else {
    // Gradients in device memory: the local reduction is stream-ordered, so
    // wait for it, then all-reduce the buckets in the same order as above.
    Context& ctx = primary_context();
    ctx.compute().synchronize();
    ctx.comm().synchronize();
    for (int b = nb - 1; b >= 0; --b) reduce_bucket(b);
  }
  return r;
}

void DistributedDataParallelEngine::sum_batch_stats(Tensor& packed, Context& ctx) {
  all_reduce(packed, "all-reduce of SyncBatchNorm statistics", kTagMain);
}

void DistributedDataParallelEngine::broadcast_buffers() {
  Tensor& b = inner_.model().arenas().buffers;
  if (b.numel() > 0) broadcast(b, "broadcast of buffers", kTagMain);
}

void DistributedDataParallelEngine::prepare_eval() {
  if (opts_.broadcast_buffers) broadcast_buffers();
}

void DistributedDataParallelEngine::all_reduce_stats(std::vector<int64_t>& v) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(v.size())}, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  all_reduce(t, "all-reduce of epoch statistics", kTagMain);
  std::copy(t.data<int64_t>(), t.data<int64_t>() + v.size(), v.begin());
}

void DistributedDataParallelEngine::barrier(const std::string& what) { group_->barrier(what, kTagMain); }

}  // namespace fanout
