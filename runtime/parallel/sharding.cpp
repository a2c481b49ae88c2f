// Shard plans and the sharding unit.
#include "runtime/parallel/sharding.h"

#include "runtime/core/error.h"

namespace fanout {

ShardPlan::ShardPlan(ShardMode mode, int64_t elements, int replicas, int processes, int rank)
    : mode_(mode), replicas_(replicas), processes_(processes), rank_(rank) {
  FANOUT_CHECK(mode != ShardMode::None && replicas >= 1 && processes >= 1 && rank >= 0 && rank < processes)
      << "a shard plan of " << replicas << " replicas in " << processes << " processes (rank " << rank << ")";
  const int64_t slots = int64_t{replicas} * processes;
  for (int64_t s = 0; s < slots; ++s) bounds_.push_back(elements * s / slots / kArenaAlign * kArenaAlign);
  bounds_.push_back(elements);
}

Sharding::Sharding(ShardPlan plan, std::vector<Module*> replicas, std::vector<Context*> contexts, ProcessLink* link,
                   RunAll run_all)
    : plan_(std::move(plan)),
      replicas_(std::move(replicas)),
      contexts_(std::move(contexts)),
      link_(link),
      run_all_(std::move(run_all)) {
  FANOUT_CHECK(!plan_.empty() && static_cast<int>(replicas_.size()) == plan_.replicas() &&
               contexts_.size() == replicas_.size() && (link_ != nullptr) == (plan_.processes() > 1))
      << "a sharding of " << plan_.shards() << " shards over " << replicas_.size() << " replicas";
  param_names_ = range_names("all-gather of the updated parameters");
}

std::vector<ArenaShard> Sharding::shards() const {
  std::vector<ArenaShard> out;
  for (int r = 0; r < plan_.replicas(); ++r) {
    const auto [b, e] = plan_.local(r);
    out.push_back({replicas_[r], contexts_[r], b, e});
  }
  return out;
}

void Sharding::prepare_grads(int r) {
  Tensor& g = replicas_[r]->arenas().grads;
  if (plan_.mode() == ShardMode::Grads) {
    // The window beyond the shard (the buckets it shares with other shards).
    const Arenas& a = replicas_[r]->arenas();
    const auto [sb, se] = plan_.local(r);
    const int64_t wb = a.grads_begin, we = wb + g.numel();
    if (sb > wb) g.flat(0, Shape{std::min(sb, we) - wb}).zero(&contexts_[r]->compute());
    if (we > se && se >= wb) g.flat(se - wb, Shape{we - se}).zero(&contexts_[r]->compute());
    return;
  }
  for (int s = 0; s < plan_.shards(); ++s) {
    const auto [b, e] = plan_.range(s);
    if (plan_.receiver(s) != r && b < e) g.flat(b, Shape{e - b}).zero(&contexts_[r]->compute());
  }
}

void Sharding::gather_params() {
  Tensor& dst = replicas_[0]->arenas().params;
  for (Context* c : contexts_) c->compute().synchronize();  // the shards' updates are done
  for (int r = 1; r < plan_.replicas(); ++r) {
    if (replicas_[r]->shares_params_with(*replicas_[0])) continue;  // updated in place
    const auto [b, e] = plan_.local(r);
    if (b < e)
      dst.flat(b, Shape{e - b}).copy_from(replicas_[r]->arenas().params.flat(b, Shape{e - b}), &contexts_[0]->compute());
  }
  contexts_[0]->compute().synchronize();
  broadcast_ranges(dst, param_names_);
}

std::vector<std::string> Sharding::range_names(const std::string& what) const {
  std::vector<std::string> out;
  if (link_)
    for (int p = 0; p < plan_.processes(); ++p) out.push_back(what + " (the range of rank " + std::to_string(p) + ")");
  return out;
}

void Sharding::broadcast_ranges(Tensor& t, const std::vector<std::string>& names) {
  if (!link_) return;
  for (int p = 0; p < plan_.processes(); ++p) {
    const auto [b, e] = plan_.process(p);
    Tensor range = t.flat(b, Shape{e - b});
    if (b < e) link_->broadcast(range, names[p], kTagMain, p);
  }
}

void Sharding::gather_ranges(Tensor& t, const std::string& what) { broadcast_ranges(t, range_names(what)); }

double Sharding::sum(double v, const std::string& what) { return link_ ? link_->sum(v, what) : v; }

}  // namespace fanout
