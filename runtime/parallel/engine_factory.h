// The one place that chooses an engine, for dp-train, dp-bench and library
// users alike: the plain engine for one device without DataParallel
// options, DataParallel for several devices (or when its options are
// asked for), DDP when a process group is given (with DataParallel inside
// when the process has several devices: hybrid).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/ddp.h"

namespace fanout {

struct EngineSpec {
  std::vector<Device> devices;  // this process's; the first is the primary
  LossOptions loss;              // the named criterion, unless `criterion` is given
  std::shared_ptr<const Criterion> criterion;  // any criterion (cloned per replica)
  DataParallelOptions dp;       // output device, SyncBatchNorm, comm, seed, math
  bool force_data_parallel = false;  // DataParallel even on one device
  // CUDA graphs of training steps, for every engine (runtime/parallel/step_graph.h);
  // make_engine copies it into dp.cuda_graphs.
  CudaGraphs cuda_graphs = CudaGraphs::Auto;
  // DDP: the group over every process (null: this process trains alone).
  std::unique_ptr<distributed::ProcessGroup> group;
  bool broadcast_buffers = true;
  int local_processes = 1;      // processes sharing this machine's cores
  distributed::Agreement agree;        // DDP: what else every rank must agree on (DdpOptions::agree)
};

// CPU devices get their share of the cores as kernel threads
// (cpu_threads_per_replica, with spec.local_processes).
std::unique_ptr<Engine> make_engine(Module& model, EngineSpec spec);

// The process group a DDP worker needs for its devices: `backend` auto picks
// NCCL for GPUs that no other process on this machine uses and Gloo
// otherwise (CPU devices; GPUs shared by processes go through host memory).
std::unique_ptr<distributed::ProcessGroup> make_process_group(const distributed::GroupOptions& opts, const std::string& backend,
                                                       const std::vector<Device>& devices, bool gpus_shared);

// The devices of local rank `local_rank` when `all` is split evenly over
// `local_world` processes; CPU devices are renumbered from 0 in each. One
// line of error when the list cannot be split.
std::vector<Device> split_devices(const std::vector<Device>& all, int local_world, int local_rank);

// What --devices auto means: every visible GPU; without one, one CPU
// replica per core of `cores` (kernel_thread_budget(): the affinity mask's
// cores, fewer under OMP_NUM_THREADS), each with one kernel thread, while each replica gets at
// least kAutoMinRowsPerReplica rows of `batch_size` (the batch of one
// process), which dp-bench --epochs measured faster than one device using
// every core. `why` says which and why, for the run's summary line.
inline constexpr int64_t kAutoMinRowsPerReplica = 16;
struct AutoDevices {
  std::string spec, why;
};
AutoDevices auto_devices(int64_t batch_size, int cores, int gpus);

// True when `all`, split over `local_world` processes, makes one GPU the
// primary of two of them (e.g. 0,0 over two processes): NCCL refuses that.
bool gpus_shared_by_processes(const std::vector<Device>& all, int local_world);

}  // namespace fanout
