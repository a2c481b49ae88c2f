// Communication among the replicas of one DataParallel model, collective in
// style: every participating rank calls each operation with its own buffer.
// Rank 0 is the primary. Implementations: CPU shared memory (cpu_comm), and
// for CUDA devices peer copies plus an add kernel, or NCCL.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;
  // Ranks 0..active-1 take part in the collectives that follow.
  virtual void begin(int active) = 0;
  // Every rank's buf receives rank 0's buf (same numel).
  virtual void broadcast(int rank, Tensor& buf, Context& ctx) = 0;
  // Rank `root`'s buf becomes the sum of every rank's buf, added in rank
  // order from rank 0 (the same bits whichever rank is the root). `op` names
  // the bucket (or piece of one) so concurrent reductions stay apart; roots
  // other than 0 are a sharded optimizer's owners.
  virtual void reduce_add(int op, int rank, const Tensor& buf, Context& ctx, int root = 0) = 0;
  // Every rank's buf becomes the sum over ranks (in rank order). Blocks.
  virtual void all_reduce(int rank, Tensor& buf, Context& ctx) = 0;
  // Completes what this rank enqueued (stream-ordered implementations).
  virtual void finish(int /*rank*/, Context& /*ctx*/) {}
  // Wakes every waiting rank with an error (a replica failed).
  virtual void abort() = 0;
};

// Shared-memory implementation for CPU devices.
std::unique_ptr<Comm> make_cpu_comm(int ranks, int max_ops);

}  // namespace fanout

namespace fanout {
// CUDA implementations (runtime/cuda/comm_cuda.cpp); without CUDA they throw.
// Peer copies plus an add kernel: works with a repeated device and without NCCL.
std::unique_ptr<Comm> make_p2p_comm(const std::vector<Device>& devices, int max_ops);
// NCCL (ncclCommInitAll): distinct devices only.
std::unique_ptr<Comm> make_nccl_comm(const std::vector<Device>& devices, int max_ops);
}  // namespace fanout
