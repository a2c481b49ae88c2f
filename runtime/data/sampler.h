// Samplers: the order in which an epoch visits a dataset's indices. Sequential,
// random (a function of seed and epoch), and distributed ones that give each of
// R ranks its share with torch.utils.data.DistributedSampler's semantics.
#pragma once
#include <cstdint>
#include <vector>

namespace fanout::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual void set_epoch(int64_t epoch) = 0;
  virtual std::vector<int64_t> indices() const = 0;  // this epoch's order (this rank's share for distributed ones)
  virtual int64_t size() const = 0;                  // indices().size()
};

// 0, 1, ..., n - 1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  void set_epoch(int64_t) override {}
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 that is a function of (seed, epoch) alone: the same
// on every standard library and platform (see shuffled_indices).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  void set_epoch(int64_t epoch) override;
  std::vector<int64_t> indices() const override { return order_; }
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }

 private:
  int64_t n_;
  uint64_t seed_;
  std::vector<int64_t> order_;
};

// DistributedSampler of PyTorch: each of R ranks gets num_samples indices,
// num_samples = drop_last ? n / R : ceil(n / R). The order over all ranks is a
// permutation of 0..n-1 (shuffle; our generator, the one RandomSampler uses
// with the same seed and epoch, not torch's) or 0..n-1, then padded by
// repeating it from the start up to num_samples * R (without drop_last) or cut
// to that length (drop_last). Rank r takes positions r, r + R, r + 2R, ...
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  void set_epoch(int64_t epoch) override;
  std::vector<int64_t> indices() const override { return order_; }
  int64_t size() const override { return num_samples_; }
  int64_t total_size() const { return num_samples_ * replicas_; }  // over all ranks
  // size() of any rank's sampler over n samples, without building one.
  static int64_t samples_per_replica(int64_t n, int num_replicas, bool drop_last);

 private:
  int64_t n_;
  int replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  int64_t num_samples_;
  std::vector<int64_t> order_;
};

// For evaluation: DistributedSampler(n, R, rank, shuffle = false, drop_last =
// false), so rank r gets r, r + R, ... and the padding wraps to 0, 1, ...
class SequentialDistributedSampler : public Sampler {
 public:
  SequentialDistributedSampler(int64_t n, int num_replicas, int rank);
  void set_epoch(int64_t) override {}
  std::vector<int64_t> indices() const override { return inner_.indices(); }
  int64_t size() const override { return inner_.size(); }
  int64_t num_valid() const;    // how many of this rank's indices are real (not padding)
  bool valid(int64_t k) const;  // whether this rank's k-th index is real: global position rank + k * R < n

 private:
  DistributedSampler inner_;
  int64_t n_;
  int replicas_, rank_;
};

// For evaluation whose per-rank sums are added up: rank r gets r, r + R,
// r + 2R, ... < n, without padding (ranks may get one index fewer).
class ShardSampler : public Sampler {
 public:
  ShardSampler(int64_t n, int num_replicas, int rank);
  void set_epoch(int64_t) override {}
  std::vector<int64_t> indices() const override;
  int64_t size() const override;

 private:
  int64_t n_;
  int replicas_, rank_;
};

// WebDataset's order over tar shards: each epoch the shards are permuted
// (shuffled_indices over shards), rank r takes permuted shards r, r + R, ...,
// reads their samples in order through a shuffle buffer of `buffer` samples
// (each next sample takes the place of a random one of the buffer, which is
// emitted; the rest at the end in random order), and yields ceil(n / R) of
// them a epoch: repeating its sequence from the start when its shards hold
// fewer, ending early when they hold more (WebDataset's with_epoch); with
// drop_last floor(n / R), DistributedSampler(drop_last=True)'s count (a
// rank whose shards hold fewer still repeats some: none does when R divides
// the shards' number and they are of one size). Reads stay within `buffer`
// samples of the shard's order. A function of (seed, epoch, rank) alone.
class ShardBufferSampler : public Sampler {
 public:
  // shards: each shard's sample count, its samples numbered consecutively from 0.
  ShardBufferSampler(std::vector<int64_t> shard_sizes, int num_replicas, int rank, uint64_t seed, int64_t buffer,
                     bool drop_last = false);
  void set_epoch(int64_t epoch) override;
  std::vector<int64_t> indices() const override { return order_; }
  int64_t size() const override { return per_rank_; }

 private:
  std::vector<int64_t> sizes_, first_;
  int replicas_, rank_;
  uint64_t seed_;
  int64_t buffer_, per_rank_ = 0;
  std::vector<int64_t> order_;
};

// Puts per-rank results (per_rank[r]: one value per index of rank r's
// SequentialDistributedSampler, in its order; the padded tail may be left
// out) back into dataset order, dropping the padding: returns n values.
std::vector<float> gather_unpadded(const std::vector<std::vector<float>>& per_rank, int64_t n);

// The permutation RandomSampler(n, seed) gives at `epoch`: Fisher-Yates driven
// by an mt19937_64 seeded with splitmix64(seed ^ epoch * golden ratio).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace fanout::data
