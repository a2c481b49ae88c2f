// Samplers: sequential, (seed, epoch)-shuffled, and per-rank distributed orders.
#include "runtime/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "runtime/core/error.h"
#include "runtime/data/seeded.h"

namespace fanout::data {

namespace {

// Uniform in [0, bound] without modulo bias: rejects the top partial range.
// Written out because std::uniform_int_distribution differs between standard libraries.
uint64_t uniform_upto(std::mt19937_64& rng, uint64_t bound) {
  if (bound == UINT64_MAX) return rng();
  const uint64_t range = bound + 1;
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % range + 1) % range;  // accept r <= limit
  uint64_t r;
  do r = rng();
  while (r > limit);
  return r % range;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

void check_size(const char* who, int64_t n) {
  FANOUT_USER_CHECK(n >= 0) << who << ": dataset size must be non-negative, got " << n;
}

void check_ranks(const char* who, int num_replicas, int rank) {
  FANOUT_USER_CHECK(num_replicas > 0) << who << ": num_replicas must be positive, got " << num_replicas;
  FANOUT_USER_CHECK(0 <= rank && rank < num_replicas)
      << who << ": rank " << rank << " is out of range [0, " << num_replicas << ")";
}

}  // namespace

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  check_size("shuffled_indices", n);
  std::vector<int64_t> order = iota(n);
  if (order.size() > 1) {
    // Fisher-Yates with a generator seeded from (seed, epoch): the same order on every standard library.
    std::mt19937_64 rng(splitmix64(seed ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull)));
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[uniform_upto(rng, i)]);
  }
  return order;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) { check_size("SequentialSampler", n); }

std::vector<int64_t> SequentialSampler::indices() const { return iota(n_); }

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  check_size("RandomSampler", n);
  set_epoch(0);
}

void RandomSampler::set_epoch(int64_t epoch) { order_ = shuffled_indices(n_, seed_, epoch); }

DistributedSampler::DistributedSampler(int64_t n, int num_replicas, int rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), replicas_(num_replicas), rank_(rank), shuffle_(shuffle), seed_(seed) {
  check_size("DistributedSampler", n);
  check_ranks("DistributedSampler", num_replicas, rank);
  num_samples_ = samples_per_replica(n, num_replicas, drop_last);
  set_epoch(0);
}

int64_t DistributedSampler::samples_per_replica(int64_t n, int num_replicas, bool drop_last) {
  // torch: drop_last and n % R ? ceil((n - R) / R) : ceil(n / R); the first is n / R (floor), also for n < R.
  return drop_last ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  const std::vector<int64_t> all = shuffle_ ? shuffled_indices(n_, seed_, epoch) : iota(n_);
  // Global position p holds all[p % n]: padding repeats the order from its start
  // (as often as needed); with drop_last, total <= n and this is a truncation.
  order_.resize(static_cast<size_t>(num_samples_));
  for (int64_t k = 0; k < num_samples_; ++k) order_[k] = all[(rank_ + k * replicas_) % n_];
}

SequentialDistributedSampler::SequentialDistributedSampler(int64_t n, int num_replicas, int rank)
    : inner_(n, num_replicas, rank, /*shuffle=*/false, 0, /*drop_last=*/false),
      n_(n),
      replicas_(num_replicas),
      rank_(rank) {}

int64_t SequentialDistributedSampler::num_valid() const {
  return n_ > rank_ ? (n_ - rank_ + replicas_ - 1) / replicas_ : 0;
}

bool SequentialDistributedSampler::valid(int64_t k) const {
  return 0 <= k && k < inner_.size() && rank_ + k * replicas_ < n_;
}

ShardSampler::ShardSampler(int64_t n, int num_replicas, int rank) : n_(n), replicas_(num_replicas), rank_(rank) {
  FANOUT_USER_CHECK(n >= 0) << "ShardSampler: dataset size must be non-negative, got " << n;
  FANOUT_USER_CHECK(num_replicas >= 1 && rank >= 0 && rank < num_replicas)
      << "ShardSampler: rank " << rank << " is outside " << num_replicas << " replicas";
}

int64_t ShardSampler::size() const { return n_ > rank_ ? (n_ - rank_ + replicas_ - 1) / replicas_ : 0; }

std::vector<int64_t> ShardSampler::indices() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(size()));
  for (int64_t i = rank_; i < n_; i += replicas_) out.push_back(i);
  return out;
}

std::vector<float> gather_unpadded(const std::vector<std::vector<float>>& per_rank, int64_t n) {
  const int64_t replicas = static_cast<int64_t>(per_rank.size());
  FANOUT_USER_CHECK(n >= 0) << "gather_unpadded: dataset size must be non-negative, got " << n;
  FANOUT_USER_CHECK(replicas > 0) << "gather_unpadded: no ranks";
  const int64_t padded = (n + replicas - 1) / replicas;
  for (int64_t r = 0; r < replicas; ++r) {
    const int64_t got = static_cast<int64_t>(per_rank[r].size());
    const int64_t real = n > r ? (n - r + replicas - 1) / replicas : 0;
    FANOUT_USER_CHECK(real <= got && got <= padded)
        << "gather_unpadded: rank " << r << " has " << got << " values, expected " << real
        << (real == padded ? "" : " to " + std::to_string(padded)) << " for " << n << " samples on " << replicas
        << " ranks";
  }
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) out[p] = per_rank[p % replicas][p / replicas];
  return out;
}

ShardBufferSampler::ShardBufferSampler(std::vector<int64_t> shard_sizes, int num_replicas, int rank, uint64_t seed,
                                       int64_t buffer, bool drop_last)
    : sizes_(std::move(shard_sizes)), replicas_(num_replicas), rank_(rank), seed_(seed), buffer_(buffer) {
  FANOUT_USER_CHECK(num_replicas >= 1 && rank >= 0 && rank < num_replicas)
      << "rank " << rank << " is outside " << num_replicas << " replicas";
  FANOUT_USER_CHECK(static_cast<int64_t>(sizes_.size()) >= num_replicas)
      << sizes_.size() << " shards cannot be split over " << num_replicas << " ranks (give at least one shard a rank)";
  FANOUT_USER_CHECK(buffer >= 1) << "the shuffle buffer must hold at least one sample, got " << buffer;
  int64_t n = 0;
  for (int64_t s : sizes_) {
    first_.push_back(n);
    n += s;
  }
  per_rank_ = drop_last ? n / num_replicas : (n + num_replicas - 1) / num_replicas;
  FANOUT_USER_CHECK(per_rank_ >= 1) << (drop_last ? "--drop-last with " : "") << n << (n == 1 ? " sample" : " samples")
                                    << " over " << num_replicas << " ranks leaves none a rank";
  set_epoch(0);
}

void ShardBufferSampler::set_epoch(int64_t epoch) {
  const std::vector<int64_t> perm = shuffled_indices(static_cast<int64_t>(sizes_.size()), seed_, epoch);
  std::vector<int64_t> seq;
  for (size_t k = static_cast<size_t>(rank_); k < perm.size(); k += static_cast<size_t>(replicas_)) {
    const size_t s = static_cast<size_t>(perm[k]);
    for (int64_t i = 0; i < sizes_[s]; ++i) seq.push_back(first_[s] + i);
  }
  // The buffer's own stream: seeded by (seed, epoch, rank), apart from the shard permutation's.
  std::mt19937_64 rng(splitmix64(splitmix64(splitmix64(seed_ ^ 0x5348524442554646ull) ^ static_cast<uint64_t>(epoch)) ^
                                 static_cast<uint64_t>(rank_)));
  auto below = [&](size_t n) {
    return static_cast<size_t>((static_cast<unsigned __int128>(rng()) * n) >> 64);
  };
  std::vector<int64_t> buf, out;
  buf.reserve(static_cast<size_t>(std::min<int64_t>(buffer_, static_cast<int64_t>(seq.size()))));
  out.reserve(seq.size());
  for (int64_t x : seq) {
    if (static_cast<int64_t>(buf.size()) < buffer_) {
      buf.push_back(x);
      continue;
    }
    const size_t k = below(buf.size());
    out.push_back(buf[k]);
    buf[k] = x;
  }
  for (size_t i = buf.size(); i > 1; --i) std::swap(buf[i - 1], buf[below(i)]);
  out.insert(out.end(), buf.begin(), buf.end());
  FANOUT_USER_CHECK(!out.empty()) << "rank " << rank_ << "'s shards hold no samples in epoch " << epoch;
  order_.clear();
  for (int64_t k = 0; k < per_rank_; ++k) order_.push_back(out[static_cast<size_t>(k) % out.size()]);
}

}  // namespace fanout::data
