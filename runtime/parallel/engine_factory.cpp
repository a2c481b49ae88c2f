// Engine choice.
#include "runtime/parallel/engine_factory.h"

#include <algorithm>
#include <set>

#include "runtime/core/error.h"
#include "runtime/parallel/single_device.h"

namespace fanout {

std::unique_ptr<Engine> make_engine(Module& model, EngineSpec spec) {
  FANOUT_USER_CHECK(!spec.devices.empty()) << "no device to train on";
  std::shared_ptr<const Criterion> criterion = spec.criterion;
  if (!criterion) criterion = make_criterion(spec.loss);
  spec.dp.cuda_graphs = spec.cuda_graphs;
  if (spec.group) {
    DdpOptions o;
    o.dp = spec.dp;
    o.broadcast_buffers = spec.broadcast_buffers;
    o.local_processes = spec.local_processes;
    o.agree = spec.agree;
    return std::make_unique<DistributedDataParallelEngine>(model, spec.devices, *criterion, o,
                                                           std::move(spec.group));
  }
  const DataParallelOptions& dp = spec.dp;
  const bool plain = spec.devices.size() == 1 && !spec.force_data_parallel && !dp.sync_bn && !dp.output_device &&
                     dp.comm == "auto";
  if (plain) {
    const Device d = spec.devices[0];
    return std::make_unique<SingleDeviceEngine>(model, d, *criterion, dp.seed,
                                                with_cpu_threads(dp.math, 1, spec.local_processes), spec.cuda_graphs);
  }
  return std::make_unique<DataParallelEngine>(model, spec.devices, *criterion, dp);
}

std::unique_ptr<distributed::ProcessGroup> make_process_group(const distributed::GroupOptions& opts, const std::string& backend,
                                                       const std::vector<Device>& devices, bool gpus_shared) {
  const bool cuda = devices.at(0).is_cuda();
  std::string b = backend;
  if (b == "auto") b = cuda && !gpus_shared ? "nccl" : "gloo";
  if (b == "nccl") {
    FANOUT_USER_CHECK(cuda) << "the nccl process-group backend needs CUDA devices";
    FANOUT_USER_CHECK(!gpus_shared) << "the nccl process-group backend needs a GPU of its own per process (NCCL refuses two "
                                       "ranks on one GPU); use the gloo backend";
    return distributed::make_nccl_group(opts, devices[0]);
  }
  FANOUT_USER_CHECK(b == "gloo") << "unknown process-group backend '" << backend << "' (expected auto, gloo or nccl)";
  return distributed::make_gloo_group(opts);
}

bool gpus_shared_by_processes(const std::vector<Device>& all, int local_world) {
  if (all.empty() || !all[0].is_cuda()) return false;
  std::set<int> primaries;
  for (int r = 0; r < local_world; ++r)
    if (!primaries.insert(split_devices(all, local_world, r)[0].index).second) return true;
  return false;
}

std::vector<Device> split_devices(const std::vector<Device>& all, int local_world, int local_rank) {
  const int n = static_cast<int>(all.size());
  FANOUT_USER_CHECK(local_world >= 1 && n % local_world == 0)
      << "cannot split " << n << " device" << (n == 1 ? "" : "s") << " evenly over " << local_world
      << " processes (list a multiple of the processes per machine, e.g. cpu:" << local_world << ")";
  FANOUT_CHECK(local_rank >= 0 && local_rank < local_world) << "local rank " << local_rank;
  const int per = n / local_world;
  std::vector<Device> out(all.begin() + local_rank * per, all.begin() + (local_rank + 1) * per);
  if (out[0].is_cpu())
    for (int i = 0; i < per; ++i) out[i] = Device::cpu(i);
  return out;
}

AutoDevices auto_devices(int64_t batch_size, int cores, int gpus) {
  if (gpus > 0) return {"all", "every visible GPU"};
  const int64_t by_rows = std::max<int64_t>(1, batch_size / kAutoMinRowsPerReplica);
  const int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(cores, by_rows)));
  if (n == 1)
    return {"cpu", cores == 1 ? "no GPU, one core to use" : "no GPU, and a batch too small to share out over the cores"};
  return {"cpu:" + std::to_string(n),
          "no GPU, so " + std::to_string(n) + " CPU replicas: one per core, at least " +
              std::to_string(kAutoMinRowsPerReplica) + " rows each; as fast as one device on every core in "
              "dp-bench --epochs (--devices cpu for one)"};
}

}  // namespace fanout
