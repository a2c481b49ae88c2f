// Samplers: sequential order, the pinned (seed, epoch) shuffle, and the
// distributed samplers' torch semantics (sizes, padding, rank shares), plus
// gathering per-rank results back into dataset order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "data/pipeline_test_util.h"
#include "runtime/data/sampler.h"
#include "support/test_util.h"

namespace fanout::data {
namespace {

using fanout::testing::expect_user_error;
using fanout::testing::iota;

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int64_t> random_order(int64_t n, uint64_t seed, int64_t epoch) {
  RandomSampler s(n, seed);
  s.set_epoch(epoch);
  EXPECT_EQ(s.size(), n);
  return s.indices();
}

TEST(SequentialSampler, Order) {
  SequentialSampler s(23);
  EXPECT_EQ(s.size(), 23);
  EXPECT_EQ(s.indices(), iota(23));
  s.set_epoch(5);
  EXPECT_EQ(s.indices(), iota(23));
  EXPECT_TRUE(SequentialSampler(0).indices().empty());
}

TEST(RandomSampler, GoldenOrder) {
  // Pins the shuffle (splitmix64 seed mix, mt19937_64, our Fisher-Yates with
  // rejection sampling): the same order on every standard library and platform,
  // and the order BatchIterator gave before it was replaced, so training runs
  // see the same batches. The expected order was also computed by an
  // independent Python re-implementation of these three pieces.
  EXPECT_EQ(random_order(10, 1234, 2), (std::vector<int64_t>{9, 5, 8, 3, 2, 1, 6, 7, 0, 4}));
  EXPECT_EQ(shuffled_indices(10, 1234, 2), (std::vector<int64_t>{9, 5, 8, 3, 2, 1, 6, 7, 0, 4}));
}

TEST(RandomSampler, CoversEveryIndexOnce) {
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    const auto order = random_order(23, 11, epoch);
    EXPECT_EQ(sorted(order), iota(23)) << "epoch " << epoch;
    EXPECT_NE(order, iota(23)) << "epoch " << epoch << " not shuffled";
  }
  EXPECT_TRUE(random_order(0, 1, 0).empty());
  EXPECT_EQ(random_order(1, 1, 3), iota(1));
}

TEST(RandomSampler, OrderIsAFunctionOfSeedAndEpoch) {
  const auto a = random_order(200, 7, 3);
  EXPECT_EQ(random_order(200, 7, 3), a);
  EXPECT_NE(random_order(200, 7, 4), a);
  EXPECT_NE(random_order(200, 8, 3), a);
  // Epochs 0 and 1 of seed 0 differ too (epoch 0 must not collapse the mix).
  EXPECT_NE(random_order(200, 0, 0), random_order(200, 0, 1));
  // Going back to an epoch gives its order again; the constructor starts at epoch 0.
  RandomSampler s(200, 7);
  EXPECT_EQ(s.indices(), random_order(200, 7, 0));
  s.set_epoch(4);
  s.set_epoch(3);
  EXPECT_EQ(s.indices(), a);
}

TEST(RandomSampler, ShuffleIsUniform) {
  // Over 24000 epochs every one of the 24 orders of 4 samples appears about
  // 1000 times (deterministic: fixed seed; the bounds are > 6 sigma wide).
  RandomSampler s(4, 99);
  std::map<std::vector<int64_t>, int> seen;
  for (int64_t epoch = 0; epoch < 24000; ++epoch) {
    s.set_epoch(epoch);
    ++seen[s.indices()];
  }
  EXPECT_EQ(seen.size(), 24u);
  for (const auto& [order, count] : seen) {
    EXPECT_GT(count, 800);
    EXPECT_LT(count, 1200);
  }
}

// torch.utils.data.DistributedSampler's num_samples, in floating point as torch computes it.
int64_t torch_num_samples(int64_t n, int r, bool drop_last) {
  if (drop_last && n % r != 0) return static_cast<int64_t>(std::ceil((n - r) / static_cast<double>(r)));
  return static_cast<int64_t>(std::ceil(n / static_cast<double>(r)));
}

// Rank shares put back at their global positions: position rank + k * R holds rank's k-th index.
std::vector<int64_t> global_order(int64_t n, int r, bool shuffle, uint64_t seed, int64_t epoch, bool drop_last) {
  std::vector<int64_t> all;
  for (int rank = 0; rank < r; ++rank) {
    DistributedSampler s(n, r, rank, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    const auto mine = s.indices();
    EXPECT_EQ(static_cast<int64_t>(mine.size()), s.size());
    EXPECT_EQ(s.size(), torch_num_samples(n, r, drop_last)) << "n " << n << " R " << r << " drop_last " << drop_last;
    EXPECT_EQ(DistributedSampler::samples_per_replica(n, r, drop_last), torch_num_samples(n, r, drop_last));
    EXPECT_EQ(s.total_size(), s.size() * r);
    all.resize(static_cast<size_t>(s.total_size()), -1);
    for (size_t k = 0; k < mine.size(); ++k) all[rank + k * r] = mine[k];
  }
  return all;
}

TEST(DistributedSampler, RanksShareTheDatasetWithTorchPadding) {
  for (int64_t n : {0, 1, 2, 3, 5, 7, 10, 23, 64, 101}) {
    for (int r : {1, 2, 3, 4, 8}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " R " << r << " shuffle " << shuffle << " drop_last "
                                            << drop_last);
          const auto all = global_order(n, r, shuffle, 5, 2, drop_last);
          const std::vector<int64_t> base = shuffle ? shuffled_indices(n, 5, 2) : iota(n);
          const int64_t total = static_cast<int64_t>(all.size());
          if (drop_last) {
            // Truncated: distinct indices, the first `total` of the permutation.
            ASSERT_LE(total, n);
            EXPECT_GT(total, n - r);
            EXPECT_EQ(all, std::vector<int64_t>(base.begin(), base.begin() + total));
          } else {
            // Every index once in the first n positions (ranks disjoint there); the
            // padding repeats the order from its start, as often as needed.
            ASSERT_GE(total, n);
            EXPECT_LT(total, n + r);
            EXPECT_EQ(sorted(std::vector<int64_t>(all.begin(), all.begin() + n)), iota(n));
            for (int64_t p = 0; p < total; ++p) ASSERT_EQ(all[p], base[p % n]) << "position " << p;
          }
        }
      }
    }
  }
}

TEST(DistributedSampler, FewerSamplesThanRanks) {
  // n = 3 on 8 ranks: each rank gets one index (the order repeated), or none with drop_last.
  std::vector<int64_t> got;
  for (int rank = 0; rank < 8; ++rank) {
    DistributedSampler s(3, 8, rank, /*shuffle=*/false);
    ASSERT_EQ(s.size(), 1);
    got.push_back(s.indices()[0]);
    EXPECT_EQ(DistributedSampler(3, 8, rank, true, 1, /*drop_last=*/true).size(), 0);
  }
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
}

TEST(DistributedSampler, NoShuffleIsStrided) {
  DistributedSampler s(10, 3, 1, /*shuffle=*/false);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7, 0}));  // positions 1, 4, 7, 10 (padding: 0)
  s.set_epoch(9);
  EXPECT_EQ(s.indices(), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false, 0, true).indices(), (std::vector<int64_t>{2, 5, 8}));
}

TEST(DistributedSampler, EpochChangesTheOrderSameEpochSameOrder) {
  DistributedSampler a(100, 4, 1, true, 3), b(100, 4, 1, true, 3);
  a.set_epoch(1);
  b.set_epoch(1);
  EXPECT_EQ(a.indices(), b.indices());
  const auto e1 = a.indices();
  a.set_epoch(2);
  EXPECT_NE(a.indices(), e1);
  a.set_epoch(1);
  EXPECT_EQ(a.indices(), e1);
  DistributedSampler other_seed(100, 4, 1, true, 4);
  other_seed.set_epoch(1);
  EXPECT_NE(other_seed.indices(), e1);
}

TEST(DistributedSampler, OneReplicaIsRandomSampler) {
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    DistributedSampler d(57, 1, 0, true, 21);
    d.set_epoch(epoch);
    EXPECT_EQ(d.indices(), random_order(57, 21, epoch));
  }
}

TEST(DistributedSampler, BadArguments) {
  expect_user_error([] { DistributedSampler(10, 0, 0); }, {"DistributedSampler", "num_replicas must be positive, got 0"});
  expect_user_error([] { DistributedSampler(10, -2, 0); }, {"num_replicas must be positive, got -2"});
  expect_user_error([] { DistributedSampler(10, 4, 4); }, {"rank 4 is out of range [0, 4)"});
  expect_user_error([] { DistributedSampler(10, 4, -1); }, {"rank -1 is out of range [0, 4)"});
  expect_user_error([] { DistributedSampler(-1, 4, 0); }, {"dataset size must be non-negative, got -1"});
  expect_user_error([] { SequentialDistributedSampler(10, 2, 2); }, {"rank 2 is out of range [0, 2)"});
  expect_user_error([] { SequentialDistributedSampler(10, 0, 0); }, {"num_replicas must be positive, got 0"});
  expect_user_error([] { SequentialSampler(-3); }, {"SequentialSampler", "got -3"});
  expect_user_error([] { RandomSampler(-3, 1); }, {"RandomSampler", "got -3"});
}

TEST(SequentialDistributedSampler, ValidMarksPaddingAndGatherRestoresOrder) {
  auto value = [](int64_t i) { return 0.5f + 3.0f * static_cast<float>(i); };  // a result per sample
  for (int64_t n : {0, 1, 2, 5, 7, 10, 23, 64}) {
    for (int r : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " R " << r);
      std::vector<std::vector<float>> padded(r), unpadded(r);
      int64_t valid_total = 0;
      for (int rank = 0; rank < r; ++rank) {
        SequentialDistributedSampler s(n, r, rank);
        const auto idx = s.indices();
        EXPECT_EQ(s.size(), (n + r - 1) / r);
        int64_t valid = 0;
        for (int64_t k = 0; k < s.size(); ++k) {
          EXPECT_EQ(s.valid(k), rank + k * r < n);
          EXPECT_EQ(idx[k], n ? (rank + k * r) % n : -1);
          padded[rank].push_back(value(idx[k]));
          if (s.valid(k)) {
            ++valid;
            unpadded[rank].push_back(value(idx[k]));
          }
        }
        EXPECT_FALSE(s.valid(-1));
        EXPECT_FALSE(s.valid(s.size()));
        EXPECT_EQ(s.num_valid(), valid);
        valid_total += valid;
      }
      EXPECT_EQ(valid_total, n);
      std::vector<float> expected;
      for (int64_t i = 0; i < n; ++i) expected.push_back(value(i));
      EXPECT_EQ(gather_unpadded(padded, n), expected);
      EXPECT_EQ(gather_unpadded(unpadded, n), expected);  // the padded tail may be left out
    }
  }
}

TEST(SequentialDistributedSampler, GatherRejectsWrongSizes) {
  expect_user_error([] { gather_unpadded({{1, 2, 3}, {3}}, 5); }, {"gather_unpadded", "rank 1 has 1 values, expected 2 to 3"});
  expect_user_error([] { gather_unpadded({{1, 2, 3, 4}, {3}}, 5); }, {"rank 0 has 4 values, expected 3"});
  expect_user_error([] { gather_unpadded({}, 5); }, {"gather_unpadded: no ranks"});
  expect_user_error([] { gather_unpadded({{1.0f}}, -1); }, {"must be non-negative, got -1"});
}

// A run interrupted after k global batches of B on N ranks and resumed on M
// (the loader skips each rank's first k * B / M indices) sees every sample of
// the epoch exactly once: rank r of R takes global positions r, r + R, ..., so
// the first k * B / R of every rank are the first k * B positions whatever R.
// One process (RandomSampler, the DataParallel and one-device order) is R = 1.
TEST(DistributedSampler, AnEpochResumedOnAnotherWorldSizeSeesEverySampleOnce) {
  const int64_t n = 2880, batch = 48;  // 60 batches; 48 splits over 1, 2, 3, 4 and 6 ranks
  auto ranks_order = [&](int world, int rank) -> std::vector<int64_t> {
    if (world == 1) return random_order(n, 11, 3);
    DistributedSampler s(n, world, rank, /*shuffle=*/true, 11);
    s.set_epoch(3);
    return s.indices();
  };
  for (auto [from, to] : std::vector<std::pair<int, int>>{{2, 3}, {3, 1}, {1, 4}, {6, 2}, {4, 4}}) {
    for (int64_t k : {1, 17, 59}) {
      std::vector<int64_t> seen;
      for (int r = 0; r < from; ++r) {
        const auto o = ranks_order(from, r);
        seen.insert(seen.end(), o.begin(), o.begin() + k * batch / from);
      }
      for (int r = 0; r < to; ++r) {
        const auto o = ranks_order(to, r);
        seen.insert(seen.end(), o.begin() + k * batch / to, o.end());
      }
      EXPECT_EQ(sorted(seen), iota(n)) << from << " -> " << to << " ranks after " << k << " batches";
    }
  }
}

TEST(ShardBufferSampler, RanksReadTheirShardsThroughABoundedBuffer) {
  // 7 shards of uneven sizes over 3 ranks; samples of shard s are first[s] .. first[s] + size - 1.
  const std::vector<int64_t> sizes = {40, 25, 33, 40, 12, 50, 30};
  std::vector<int64_t> first;
  int64_t n = 0;
  for (int64_t v : sizes) first.push_back(n), n += v;
  const int64_t buffer = 16;
  for (int64_t epoch : {0, 1, 5}) {
    std::set<int64_t> seen_shards;
    for (int rank = 0; rank < 3; ++rank) {
      ShardBufferSampler s(sizes, 3, rank, 9, buffer);
      s.set_epoch(epoch);
      const auto idx = s.indices();
      ASSERT_EQ(static_cast<int64_t>(idx.size()), (n + 2) / 3);  // ceil(n / R) on every rank
      EXPECT_EQ(s.size(), static_cast<int64_t>(idx.size()));
      // The rank's shards: the permuted shards rank, rank + 3, ...
      const auto perm = shuffled_indices(static_cast<int64_t>(sizes.size()), 9, epoch);
      std::vector<int64_t> mine, read;
      for (size_t k = static_cast<size_t>(rank); k < perm.size(); k += 3) mine.push_back(perm[k]);
      for (int64_t sh : mine)
        for (int64_t i = 0; i < sizes[static_cast<size_t>(sh)]; ++i) read.push_back(first[static_cast<size_t>(sh)] + i);
      for (int64_t sh : mine) EXPECT_TRUE(seen_shards.insert(sh).second) << "shard " << sh << " on two ranks";
      // Each emitted sample was read at most `buffer` places later than its position (before the wrap):
      // reads stay near-sequential. And no sample twice before the sequence wraps.
      std::map<int64_t, size_t> position;
      for (size_t k = 0; k < read.size(); ++k) position[read[k]] = k;
      const size_t unique = std::min(idx.size(), read.size());
      std::set<int64_t> once(idx.begin(), idx.begin() + static_cast<int64_t>(unique));
      EXPECT_EQ(once.size(), unique);
      for (size_t k = 0; k < unique; ++k) {
        ASSERT_TRUE(position.count(idx[k])) << idx[k] << " is not in rank " << rank << "'s shards";
        EXPECT_LE(position[idx[k]], k + static_cast<size_t>(buffer));
      }
      // Fewer samples than ceil(n / R): the sequence repeats from its start.
      for (size_t k = read.size(); k < idx.size(); ++k) EXPECT_EQ(idx[k], idx[k - read.size()]);
      // A function of (seed, epoch, rank): the same again, another at another epoch.
      ShardBufferSampler again(sizes, 3, rank, 9, buffer);
      again.set_epoch(epoch);
      EXPECT_EQ(again.indices(), idx);
      again.set_epoch(epoch + 1);
      EXPECT_NE(again.indices(), idx);
    }
    EXPECT_EQ(seen_shards.size(), sizes.size());
  }
  // One rank: every sample exactly once, shuffled.
  ShardBufferSampler one(sizes, 1, 0, 2, buffer);
  auto all = one.indices();
  EXPECT_NE(all, iota(n));
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, iota(n));
  expect_user_error([&] { ShardBufferSampler(std::vector<int64_t>{5, 5}, 3, 0, 1, 4); }, {"2 shards cannot be split over 3 ranks"});
  expect_user_error([&] { ShardBufferSampler(sizes, 1, 0, 1, 0); }, {"shuffle buffer"});
}

// --drop-last under DDP: floor(N / R) samples a rank, none repeated within it (DistributedSampler's
// drop_last count); without it ceil(N / R), a rank short of samples repeating its first.
TEST(ShardBufferSampler, DropLastTakesTheRoundedDownShareWithoutRepeats) {
  const std::vector<int64_t> sizes = {3, 2};  // 5 samples, 2 ranks
  for (int64_t epoch = 0; epoch < 4; ++epoch)
    for (int rank = 0; rank < 2; ++rank) {
      ShardBufferSampler kept(sizes, 2, rank, 7, 4), dropped(sizes, 2, rank, 7, 4, /*drop_last=*/true);
      kept.set_epoch(epoch);
      dropped.set_epoch(epoch);
      EXPECT_EQ(kept.size(), 3);
      EXPECT_EQ(dropped.size(), 2);
      auto idx = dropped.indices();
      ASSERT_EQ(idx.size(), 2u);
      EXPECT_NE(idx[0], idx[1]);
      const auto all = kept.indices();
      EXPECT_TRUE(std::equal(idx.begin(), idx.end(), all.begin())) << "the same order, cut";
    }
  expect_user_error([&] { ShardBufferSampler(std::vector<int64_t>{1, 0, 0}, 3, 0, 1, 4, true); },
                    {"--drop-last with 1 sample over 3 ranks leaves none a rank"});
}

}  // namespace
}  // namespace fanout::data
