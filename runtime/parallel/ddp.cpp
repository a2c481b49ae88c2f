// DDP engine: DataParallel over this process's devices with a process group.
#include "runtime/parallel/ddp.h"

#include "runtime/core/error.h"

namespace fanout {

namespace {
DataParallelOptions ddp_dp_options(DataParallelOptions o, std::unique_ptr<distributed::ProcessGroup> group,
                                   int devices, int local_processes) {
  FANOUT_CHECK(group) << "DDP needs a process group";
  o.math = with_cpu_threads(o.math, devices, std::max(1, local_processes));
  o.group = std::move(group);
  o.require_all_grads = true;  // DDP refuses a step in which a parameter got no gradient
  return o;
}
}  // namespace

DistributedDataParallelEngine::DistributedDataParallelEngine(Module& model, const std::vector<Device>& devices,
                                                             const Criterion& criterion, const DdpOptions& opts,
                                                             std::unique_ptr<distributed::ProcessGroup> group)
    : inner_(model, devices, criterion,
             ddp_dp_options(opts.dp, std::move(group), static_cast<int>(devices.size()), opts.local_processes)),
      link_(*inner_.data_parallel().process_link()),
      opts_(opts) {
  // A rank with another model or options would exchange buffers of other
  // sizes: one line naming the difference instead, on every rank.
  Arenas& a = inner_.model().arenas();
  const DataParallel& dp = inner_.data_parallel();
  uint64_t hash = 0;  // the bucket bounds, hashed (unsigned: wraps, as a hash may)
  for (const GradBucket& b : dp.buckets().buckets())
    hash = hash * 1000003u + static_cast<uint64_t>(b.begin) * 31u + static_cast<uint64_t>(b.count);
  const auto layout = static_cast<int64_t>(hash >> 1);
  distributed::Agreement agree = {{"parameter elements", a.params.numel()},
                           {"buffer elements", a.buffers.numel()},
                           {"parameters", static_cast<int64_t>(inner_.model().named_parameters().size())},
                           {"gradient buckets", dp.num_buckets()},
                           {"bucket layout hash", layout},
                           {"devices per process", static_cast<int64_t>(devices.size())},
                           {"precision (autocast dtype)", static_cast<int64_t>(opts.dp.math.autocast)},
                           {"split-invariant math", opts.dp.math.split_invariant},
                           {"gradient reduce dtype", static_cast<int64_t>(opts.dp.grad_reduce_dtype)},
                           {"sharded optimizer", opts.dp.shard_optimizer},
                           {"sharded gradients", opts.dp.shard_grads}};
  agree.insert(agree.end(), opts.agree.begin(), opts.agree.end());
  distributed::check_agreement(link_.group(), agree, [&](const Tensor& in, Tensor& out) {
    link_.all_gather_host(in, out, "all-gather of the run's description (start-up check)", kTagMain);
  });
  // Start from rank 0's state.
  link_.broadcast(a.params, "broadcast of the initial parameters", kTagMain);
  if (a.buffers.numel() > 0) link_.broadcast(a.buffers, "broadcast of the initial buffers", kTagMain);
}

StepResult DistributedDataParallelEngine::forward_backward(const Tensor& x, const Tensor& y, float grad_scale,
                                                           bool sync) {
  if (opts_.broadcast_buffers) broadcast_buffers();
  return inner_.forward_backward(x, y, grad_scale, sync);
}

void DistributedDataParallelEngine::broadcast_buffers() {
  Tensor& b = inner_.model().arenas().buffers;
  if (b.numel() > 0) link_.broadcast(b, "broadcast of buffers", kTagMain);
}

void DistributedDataParallelEngine::prepare_eval() {
  if (opts_.broadcast_buffers) broadcast_buffers();
}

}  // namespace fanout
