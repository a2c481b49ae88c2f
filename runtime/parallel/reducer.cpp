// Gradient buckets and the per-rank ready bookkeeping.
#include "runtime/parallel/reducer.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace fanout {

BucketLayout::BucketLayout(Module& model, size_t bucket_bytes) {
  struct P {
    int64_t offset, numel;
    std::string name;
  };
  std::vector<P> ps;
  for (auto& [name, p] : model.named_parameters()) ps.push_back({p->offset, p->shape.numel(), name});
  std::sort(ps.begin(), ps.end(), [](const P& a, const P& b) { return a.offset < b.offset; });
  const int64_t target =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / dtype_size(model.grad_dtype())));
  const int64_t arena = model.arenas().params.numel();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (buckets_.empty() || buckets_.back().count >= target)
      buckets_.push_back({ps[i].offset, 0, static_cast<int>(i), 0});
    GradBucket& b = buckets_.back();
    const int64_t end = i + 1 < ps.size() ? ps[i + 1].offset : arena;
    b.count = end - b.begin;
    b.params++;
    offsets_.push_back(ps[i].offset);
    bucket_of_.push_back(static_cast<int>(buckets_.size()) - 1);
    names_.push_back(ps[i].name);
  }
}

std::pair<int, int> BucketLayout::params_in(size_t begin, size_t count) const {
  auto lo = std::lower_bound(offsets_.begin(), offsets_.end(), static_cast<int64_t>(begin));
  auto hi = std::lower_bound(lo, offsets_.end(), static_cast<int64_t>(begin + count));
  return {static_cast<int>(lo - offsets_.begin()), static_cast<int>(hi - offsets_.begin())};
}

Reducer::Reducer(const BucketLayout& layout, int ranks, std::function<void(int, int)> issue)
    : layout_(layout),
      issue_(std::move(issue)),
      param_ready_(ranks, std::vector<char>(layout.num_params(), 0)),
      bucket_ready_(ranks, std::vector<int>(layout.size(), 0)),
      next_(ranks, layout.size() - 1) {}

void Reducer::begin() {
  for (auto& r : param_ready_) std::fill(r.begin(), r.end(), 0);
  for (auto& r : bucket_ready_) std::fill(r.begin(), r.end(), 0);
  std::fill(next_.begin(), next_.end(), layout_.size() - 1);
}

void Reducer::grad_ready(int rank, size_t begin, size_t count) {
  const auto [lo, hi] = layout_.params_in(begin, count);
  for (int p = lo; p < hi; ++p) {
    FANOUT_CHECK(!param_ready_[rank][p]) << "gradient of " << layout_.param_name(p) << " reported twice in one pass";
    param_ready_[rank][p] = 1;
    ++bucket_ready_[rank][layout_.bucket_of(p)];
  }
  issue_ready(rank);
}

void Reducer::flush(int rank) {
  for (int b = 0; b < layout_.size(); ++b) bucket_ready_[rank][b] = layout_.buckets()[b].params;
  issue_ready(rank);
}

std::vector<std::string> Reducer::unready(int rank) const {
  std::vector<std::string> out;
  for (int p = 0; p < layout_.num_params(); ++p)
    if (!param_ready_[rank][p]) out.push_back(layout_.param_name(p));
  return out;
}

void Reducer::issue_ready(int rank) {
  int& next = next_[rank];
  while (next >= 0 && bucket_ready_[rank][next] == layout_.buckets()[next].params) issue_(rank, next--);
}

}  // namespace fanout
