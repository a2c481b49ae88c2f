// Gradient bucketing shared by DataParallel (reduce onto the primary) and
// DDP (all-reduce across processes): a layout of buckets over the flat
// gradient arena, and a reducer that counts, per rank, which parameters'
// gradients are final and hands each bucket on once complete, last bucket
// first. The order is the same on every rank whatever order backward
// finishes layers in, as collective libraries require.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/nn/module.h"

namespace fanout {

struct GradBucket {
  int64_t begin = 0, count = 0;  // arena elements (alignment padding included)
  int first_param = 0, params = 0;  // parameters [first_param, first_param + params) in arena order
};

// Contiguous arena ranges of whole parameters, about `bucket_bytes` each
// (at the arena's gradient dtype), in arena order.
class BucketLayout {
 public:
  BucketLayout(Module& model, size_t bucket_bytes);
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int size() const { return static_cast<int>(buckets_.size()); }
  int num_params() const { return static_cast<int>(offsets_.size()); }
  // Parameters whose first element lies in [begin, begin + count).
  std::pair<int, int> params_in(size_t begin, size_t count) const;
  int bucket_of(int param) const { return bucket_of_[param]; }
  const std::string& param_name(int param) const { return names_[param]; }

 private:
  std::vector<GradBucket> buckets_;
  std::vector<int64_t> offsets_;  // sorted: arena offset of each parameter
  std::vector<int> bucket_of_;
  std::vector<std::string> names_;
};

class Reducer {
 public:
  // issue(rank, bucket) runs on the reporting rank's thread for each bucket
  // that became complete on that rank, in descending bucket order.
  Reducer(const BucketLayout& layout, int ranks, std::function<void(int rank, int bucket)> issue);
  // A new backward pass on every rank: nothing is ready.
  void begin();
  // From Context::on_grad_ready: [begin, begin + count) of `rank`'s arena is final.
  void grad_ready(int rank, size_t begin, size_t count);
  // End of backward on `rank`: parameters that got no gradient (unused
  // ones) count as ready, and the remaining buckets are issued in order.
  void flush(int rank);
  // Names of the parameters `rank` has not reported this pass.
  std::vector<std::string> unready(int rank) const;
  bool complete(int rank) const { return next_[rank] < 0; }

 private:
  void issue_ready(int rank);
  const BucketLayout& layout_;
  std::function<void(int, int)> issue_;
  std::vector<std::vector<char>> param_ready_;  // [rank][param]
  std::vector<std::vector<int>> bucket_ready_;  // [rank][bucket] parameters reported
  std::vector<int> next_;                       // [rank] next bucket to issue (counts down)
};

}  // namespace fanout
