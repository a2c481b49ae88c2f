// Sharded optimizer.
#include "runtime/train/sharded_optimizer.h"

#include "runtime/core/error.h"

namespace fanout::train {

namespace {
std::vector<std::unique_ptr<optim::Optimizer>> shard_optimizers(Sharding& sharding, const optim::OptimizerOptions& o,
                                                                const std::vector<optim::ParamGroup>& groups) {
  std::vector<std::unique_ptr<optim::Optimizer>> out;
  for (const ArenaShard& s : sharding.shards()) {
    optim::OptimizerOptions so = o;
    so.range = {s.begin, s.end};
    out.push_back(optim::make_optimizer(*s.replica, *s.ctx, so, groups));
  }
  return out;
}
}  // namespace

ShardedOptimizer::ShardedOptimizer(Sharding& sharding, const optim::OptimizerOptions& o,
                                   std::vector<optim::ParamGroup> groups)
    : ShardedOptimizer(sharding, o, shard_optimizers(sharding, o, groups)) {}

ShardedOptimizer::ShardedOptimizer(Sharding& sharding, const optim::OptimizerOptions& o, Shards shards)
    : Optimizer(o, shards.at(0)->groups()),
      sharding_(sharding),
      shards_(std::move(shards)),
      ranges_(sharding.shards()),
      across_processes_(sharding.across_processes()) {}

void ShardedOptimizer::check_engine() const {
  for (const auto& s : shards_)
    if (auto* a = dynamic_cast<optim::ArenaOptimizer*>(s.get())) a->context();  // throws once the context is gone
}

void ShardedOptimizer::step() {
  check_engine();
  full_.clear();  // the last checkpoint's assembled copy: each replica holds its range's state alone again
  const float rate = lr();
  sharding_.run([&](int i) {
    shards_[i]->set_lr(rate);
    shards_[i]->step();
  });
  sharding_.gather_params();
  Optimizer::set_steps(steps() + 1);
}

void ShardedOptimizer::zero_grad() {
  check_engine();
  sharding_.run([&](int i) { shards_[i]->zero_grad(); });
}

void ShardedOptimizer::set_steps(int64_t s) {
  Optimizer::set_steps(s);
  for (auto& o : shards_) o->set_steps(s);
}

std::vector<std::string> ShardedOptimizer::state_names() const { return shards_[0]->state_names(); }

std::vector<int64_t> ShardedOptimizer::state_bytes() const {
  std::vector<int64_t> out;
  for (const auto& s : shards_) out.push_back(s->state_bytes()[0]);
  // The assembled copy checkpoints read, on the primary's host until the next step.
  for (const auto& [name, t] : full_)
    if (!out.empty() && t.defined()) out[0] += static_cast<int64_t>(t.nbytes());
  return out;
}

void ShardedOptimizer::assemble() {
  const int64_t total = model().arenas().params.numel();
  const std::vector<std::string> names = state_names();
  full_.resize(names.size());
  for (size_t k = 0; k < names.size(); ++k) {
    full_[k].first = names[k];
    ensure(full_[k].second, Shape{total}, DType::F32, Device::cpu());
    full_[k].second.zero();
    for (size_t i = 0; i < shards_.size(); ++i) {
      auto st = shards_[i]->state();
      const int64_t n = ranges_[i].end - ranges_[i].begin;
      if (n > 0) full_[k].second.flat(ranges_[i].begin, Shape{n}).copy_from(*st[k].second);
    }
  }
}

std::vector<std::pair<std::string, Tensor*>> ShardedOptimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  if (steps() == 0) return out;
  // Across processes the other processes' ranges are those gather_state() brought.
  if (!across_processes_ || full_.empty()) assemble();
  for (auto& [name, t] : full_) out.emplace_back(name, &t);
  return out;
}

void ShardedOptimizer::gather_state() {
  check_engine();
  if (steps() == 0) return;
  assemble();
  for (auto& [name, t] : full_) sharding_.gather_ranges(t, "all-gather of optimizer state '" + name + "'");
  gathered_at_ = steps();
}

bool ShardedOptimizer::state_complete() const { return !across_processes_ || steps() == 0 || gathered_at_ == steps(); }

void ShardedOptimizer::state_written() {
  for (size_t k = 0; k < full_.size(); ++k)
    for (size_t i = 0; i < shards_.size(); ++i) {
      auto st = shards_[i]->state();
      const int64_t n = ranges_[i].end - ranges_[i].begin;
      if (n > 0) st[k].second->copy_from(full_[k].second.flat(ranges_[i].begin, Shape{n}));
    }
}

double ShardedOptimizer::grad_sum_squares() {
  check_engine();
  double sum = 0;
  for (size_t i = 0; i < shards_.size(); ++i)
    if (ranges_[i].end > ranges_[i].begin) sum += shards_[i]->grad_sum_squares();
  return sharding_.sum(sum, "the gradient's squared norm");
}

void ShardedOptimizer::scale_grads(float a) {
  check_engine();
  sharding_.run([&](int i) {
    if (ranges_[i].end > ranges_[i].begin) shards_[i]->scale_grads(a);
  });
}

void ShardedOptimizer::clamp_grads(float limit) {
  check_engine();
  sharding_.run([&](int i) {
    if (ranges_[i].end > ranges_[i].begin) shards_[i]->clamp_grads(limit);
  });
}

std::unique_ptr<optim::Optimizer> make_engine_optimizer(Engine& engine, const optim::OptimizerOptions& o,
                                                        std::vector<optim::ParamGroup> groups) {
  if (Sharding* s = engine.sharding()) return std::make_unique<ShardedOptimizer>(*s, o, std::move(groups));
  return optim::make_optimizer(engine.model(), engine.step_context(), o, std::move(groups));
}

}  // namespace fanout::train
