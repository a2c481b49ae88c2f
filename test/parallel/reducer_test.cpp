// Gradient bucketing: buckets cover the arena in whole parameters, and the
// reducer issues each rank's buckets last to first, once each, whatever
// order the gradients arrive in; unused parameters are named.
#include "runtime/parallel/reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <random>

#include "models/zoo/zoo.h"

namespace fanout {
namespace {

struct Fixture {
  std::unique_ptr<Module> model = models::make_model("lenet", Shape{1, 28, 28}, 10, 1);
  // Small buckets, so that lenet's parameters make several.
  BucketLayout layout{*model, 16 * 1024};
  std::vector<std::pair<std::string, Parameter*>> params = model->named_parameters();
};

TEST(BucketLayout, CoversTheArenaInWholeParameters) {
  Fixture f;
  ASSERT_GE(f.layout.size(), 3);
  EXPECT_EQ(f.layout.num_params(), static_cast<int>(f.params.size()));
  int next_param = 0;
  int64_t end = 0;
  for (const GradBucket& b : f.layout.buckets()) {
    EXPECT_EQ(b.first_param, next_param);
    EXPECT_GE(b.params, 1);
    EXPECT_EQ(b.begin, end);
    for (int p = b.first_param; p < b.first_param + b.params; ++p) {
      EXPECT_EQ(f.layout.bucket_of(p), &b - f.layout.buckets().data());
      const Parameter& prm = *f.params[p].second;
      EXPECT_GE(prm.offset, b.begin);
      EXPECT_LE(prm.offset + prm.shape.numel(), b.begin + b.count) << f.params[p].first;
      EXPECT_EQ(f.layout.param_name(p), f.params[p].first);
    }
    next_param += b.params;
    end = b.begin + b.count;
  }
  EXPECT_EQ(next_param, static_cast<int>(f.params.size()));
}

TEST(BucketReadiness, IssuesLastToFirstOnceEachInAnyArrivalOrder) {
  Fixture f;
  const int ranks = 2;
  std::mutex mu;
  std::vector<std::vector<int>> issued(ranks);
  BucketReadiness r(f.layout, ranks, [&](int rank, int bucket) {
    std::lock_guard<std::mutex> g(mu);
    issued[rank].push_back(bucket);
  });
  std::mt19937_64 rng(5);
  for (int pass = 0; pass < 3; ++pass) {
    r.begin();
    for (auto& v : issued) v.clear();
    for (int rank = 0; rank < ranks; ++rank) {
      std::vector<int> order(f.params.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
      if (pass > 0) std::shuffle(order.begin(), order.end(), rng);  // pass 0: forward order, the worst case
      for (int p : order) {
        const Parameter& prm = *f.params[p].second;
        r.grad_ready(rank, static_cast<size_t>(prm.offset), static_cast<size_t>(prm.shape.numel()));
        // Whatever is issued so far is a prefix of last-to-first.
        for (size_t i = 0; i < issued[rank].size(); ++i) EXPECT_EQ(issued[rank][i], f.layout.size() - 1 - int(i));
      }
      EXPECT_TRUE(r.complete(rank));
      r.flush(rank);  // nothing left: must not issue twice
      std::vector<int> want(f.layout.size());
      for (int i = 0; i < f.layout.size(); ++i) want[i] = f.layout.size() - 1 - i;
      EXPECT_EQ(issued[rank], want) << "rank " << rank << " pass " << pass;
    }
  }
}

TEST(BucketReadiness, UnreportedParametersAreNamedAndFlushed) {
  Fixture f;
  std::vector<int> issued;
  BucketReadiness r(f.layout, 1, [&](int, int bucket) { issued.push_back(bucket); });
  r.begin();
  const int skipped = 1;  // a parameter of the first bucket: nothing can be issued past it... until flush
  for (int p = 0; p < static_cast<int>(f.params.size()); ++p) {
    if (p == skipped) continue;
    const Parameter& prm = *f.params[p].second;
    r.grad_ready(0, static_cast<size_t>(prm.offset), static_cast<size_t>(prm.shape.numel()));
  }
  EXPECT_EQ(r.unready(0), std::vector<std::string>{f.params[skipped].first});
  EXPECT_FALSE(r.complete(0));
  EXPECT_EQ(static_cast<int>(issued.size()), f.layout.size() - 1) << "every bucket but the first";
  r.flush(0);
  EXPECT_TRUE(r.complete(0));
  EXPECT_EQ(static_cast<int>(issued.size()), f.layout.size());
  EXPECT_EQ(issued.back(), 0);
}

}  // namespace
}  // namespace fanout
