// Hook through which BatchNorm layers combine their per-channel statistics
// across data-parallel replicas (SyncBatchNorm). The DP engine implements it;
// layers only call it, so neither knows the other's concrete type.
#pragma once
#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout {

class BatchStatSync {
 public:
  virtual ~BatchStatSync() = default;
  // Sums `stats` (float64 batch statistics, or float32 gradient sums) and
  // `count` over all replicas, in place, on every replica. Called once per BatchNorm layer in forward and once in backward,
  // in the same order on every replica; `layer_id` tells the layers apart.
  virtual void all_reduce(int layer_id, Tensor& stats, int64_t& count, Context& ctx) = 0;
};

}  // namespace fanout
