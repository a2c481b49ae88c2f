// ZeRO over a sharded engine's replicas: one optimizer per shard of the
// parameter arena, on its replica's device, holding state for its shard
// alone (runtime/parallel/sharding.h). step() runs every shard's
// update at once on the replicas' threads and gathers the updated shards
// into the primary's model (across processes too, under DDP), which the
// next forward broadcasts. Clipping by norm sums the shards' squares over
// every process, so it clips by the whole gradient's norm; loss scaling
// checks every shard. state() assembles the full state laid out like the
// arena, so checkpoints are those of an unsharded optimizer and load into
// any shard count; across processes gather_state() first brings the other
// processes' shards.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine.h"

namespace fanout::train {

class ShardedOptimizer final : public optim::Optimizer {
 public:
  ShardedOptimizer(Sharding& sharding, const optim::OptimizerOptions& o, std::vector<optim::ParamGroup> groups = {});
  void step() override;
  void zero_grad() override;
  void set_steps(int64_t s) override;
  std::vector<std::pair<std::string, Tensor*>> state() override;
  void state_written() override;
  void gather_state() override;
  bool state_complete() const override;
  std::vector<std::string> state_names() const override;
  std::vector<int64_t> state_bytes() const override;
  double grad_sum_squares() override;
  void scale_grads(float a) override;
  void clamp_grads(float limit) override;
  Module& model() override { return *ranges_.at(0).replica; }

  int num_shards() const { return static_cast<int>(shards_.size()); }
  optim::Optimizer& shard(int i) { return *shards_[i]; }

 private:
  using Shards = std::vector<std::unique_ptr<optim::Optimizer>>;
  ShardedOptimizer(Sharding& sharding, const optim::OptimizerOptions& o, Shards shards);
  Sharding& sharding_;
  Shards shards_;
  std::vector<ArenaShard> ranges_;
  void assemble();
  // A one-line error once the engine (its replicas' contexts and sharding_) is gone.
  void check_engine() const;
  std::vector<std::pair<std::string, Tensor>> full_;  // assembled state (host), for checkpoints; freed by step()
  bool across_processes_;
  int64_t gathered_at_ = -1;  // steps() when gather_state() last ran
};

// The optimizer a Trainer steps for `engine`: a ShardedOptimizer when the
// engine is sharded, else make_optimizer over its model.
std::unique_ptr<optim::Optimizer> make_engine_optimizer(Engine& engine, const optim::OptimizerOptions& o,
                                                        std::vector<optim::ParamGroup> groups = {});

}  // namespace fanout::train
