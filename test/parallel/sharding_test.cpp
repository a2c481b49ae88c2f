// ShardPlan: the arithmetic every sharded path reads (the Reducer's
// targets, the sharded optimizer's ranges, the range broadcasts).
#include <gtest/gtest.h>

#include "runtime/parallel/sharding.h"

namespace fanout {
namespace {

TEST(ShardPlan, BalancedAlignedAndCoveringTheArena) {
  for (const int64_t elements : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{124475904}}) {
    for (const auto& [replicas, processes] : std::vector<std::pair<int, int>>{{1, 2}, {2, 1}, {3, 1}, {2, 2}, {3, 4}}) {
      for (int rank = 0; rank < processes; ++rank) {
        SCOPED_TRACE(std::to_string(elements) + " over " + std::to_string(replicas) + "x" + std::to_string(processes));
        const ShardPlan p(ShardMode::Optimizer, elements, replicas, processes, rank);
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

}  // namespace
}  // namespace fanout
