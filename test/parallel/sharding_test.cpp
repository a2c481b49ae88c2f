// ShardPlan: the arithmetic every sharded path reads (the Reducer's
// targets, the sharded optimizer's ranges, the range broadcasts).
#include <gtest/gtest.h>

#include "runtime/core/error.h"
#include "runtime/parallel/sharding.h"
#include "runtime/parallel/slot_pool.h"

namespace fanout {
namespace {

TEST(ShardPlan, BalancedAlignedAndCoveringTheArena) {
  for (const int64_t elements : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{124475904}}) {
    for (const auto& [replicas, processes] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {3, 1}, {2, 2}, {3, 4}}) {
      for (int rank = 0; rank < processes; ++rank) {
        SCOPED_TRACE(std::to_string(elements) + " over " + std::to_string(replicas) + "x" + std::to_string(processes));
        const ShardPlan p(ShardMode::State, elements, replicas, processes, rank);
        const int n = replicas * processes;
        ASSERT_EQ(p.shards(), n);
        EXPECT_EQ(p.bounds().front(), 0);
        EXPECT_EQ(p.bounds().back(), elements);
        for (int s = 0; s < n; ++s) {
          const auto [b, e] = p.range(s);
          EXPECT_LE(b, e);
          if (s > 0) EXPECT_EQ(b % kArenaAlign, 0);
          // Balanced: no shard more than its share plus one alignment unit.
          EXPECT_LE(e - b, (elements + n - 1) / n + kArenaAlign);
          EXPECT_EQ(p.home(s), s / replicas);
          EXPECT_EQ(p.receiver(s), s / replicas == rank ? s % replicas : 0);
        }
        for (int q = 0; q < processes; ++q) {  // a process's shards are one contiguous range
          EXPECT_EQ(p.process(q).first, p.range(q * replicas).first);
          EXPECT_EQ(p.process(q).second, p.range(q * replicas + replicas - 1).second);
        }
        for (int r = 0; r < replicas; ++r) EXPECT_EQ(p.local(r), p.range(rank * replicas + r));
      }
    }
  }
  EXPECT_TRUE(ShardPlan().empty());
}

// ZeRO-2's pool of gradient blocks: first fit, freed neighbours merged, a
// chunk added only when nothing fits, and a repeated pattern of takes and
// gives served from the chunks it already has.
TEST(SlotPool, FirstFitMergesAndStopsGrowingOnARepeatedPattern) {
  SlotPool pool(DType::F32, Device::cpu());
  Tensor a = pool.take(100), b = pool.take(50);
  EXPECT_EQ(pool.chunks(), 2);
  EXPECT_EQ(pool.in_use(), 150);
  pool.give(a);
  Tensor c = pool.take(30), d = pool.take(70);  // both inside a's chunk
  EXPECT_EQ(pool.chunks(), 2);
  EXPECT_TRUE(c.same_storage(d));
  EXPECT_EQ(static_cast<float*>(d.raw()) - static_cast<float*>(c.raw()), 30);
  pool.give(c);
  pool.give(d);                       // merged with c's block: 100 free again
  EXPECT_THROW(pool.give(c), Error);  // given back twice
  Tensor e = pool.take(100);          // fits only if merged
  EXPECT_EQ(pool.chunks(), 2);
  pool.give(e);
  pool.give(b);
  EXPECT_EQ(pool.in_use(), 0);
  const int64_t bytes = pool.bytes();
  for (int pass = 0; pass < 3; ++pass) {  // a pass's pattern: take 100, take 50, give 100, take 80, give all
    Tensor x = pool.take(100), y = pool.take(50);
    pool.give(x);
    Tensor z = pool.take(80);
    pool.give(y);
    pool.give(z);
  }
  EXPECT_EQ(pool.bytes(), bytes);
  SlotPool other(DType::F32, Device::cpu());
  Tensor foreign = other.take(4);
  EXPECT_THROW(pool.give(foreign), Error);
}

}  // namespace
}  // namespace fanout
