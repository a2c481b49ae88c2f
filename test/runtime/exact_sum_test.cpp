// ExactSum: the same values give the same bits in any order and grouping,
// and the value is the exact sum rounded once.
#include "runtime/core/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace fanout {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Floats k * 2^-20 with |k| < 2^23: every partial sum of 10^5 of them is
// exact in double, so plain double addition is the reference.
TEST(ExactSum, EqualsTheExactSumInAnyOrderAndGrouping) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int32_t> k(-(1 << 23) + 1, (1 << 23) - 1);
  std::vector<float> v(100000);
  double ref = 0;
  for (auto& x : v) {
    x = std::ldexp(static_cast<float>(k(rng)), -20);
    ref += x;
  }
  ExactSum in_order;
  in_order.add(v.data(), static_cast<int64_t>(v.size()));
  EXPECT_TRUE(same_bits(in_order.value(), ref)) << in_order.value() << " vs " << ref;

  std::shuffle(v.begin(), v.end(), rng);
  ExactSum a, b, c;  // three uneven parts, merged in another order
  a.add(v.data(), 1);
  b.add(v.data() + 1, 70000);
  c.add(v.data() + 70001, static_cast<int64_t>(v.size()) - 70001);
  c.merge(a);
  c.merge(b);
  EXPECT_TRUE(same_bits(c.value(), in_order.value()));
}

// Values spanning the whole float range, where float or double sums depend
// on the order: every order gives the same bits.
TEST(ExactSum, WideRangeIsOrderIndependent) {
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int> e(-140, 120);
  std::uniform_real_distribution<float> m(-2.0f, 2.0f);
  std::vector<float> v(20000);
  for (auto& x : v) x = std::ldexp(m(rng), e(rng));
  ExactSum first;
  first.add(v.data(), static_cast<int64_t>(v.size()));
  double naive_first = 0;
  for (float x : v) naive_first += x;
  bool naive_changed = false;
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(v.begin(), v.end(), rng);
    ExactSum s;
    s.add(v.data(), static_cast<int64_t>(v.size()));
    EXPECT_TRUE(same_bits(s.value(), first.value())) << "trial " << trial;
    double naive = 0;
    for (float x : v) naive += x;
    naive_changed = naive_changed || !same_bits(naive, naive_first);
  }
  EXPECT_TRUE(naive_changed) << "the data should make a double sum depend on the order";
}

TEST(ExactSum, CancellationAndTheExtremes) {
  ExactSum s;
  s.add(1e30f);
  s.add(1.0f);
  s.add(-1e30f);
  EXPECT_EQ(s.value(), 1.0);

  const float tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  ExactSum t;
  t.add(tiny);
  t.add(tiny);
  EXPECT_EQ(t.value(), std::ldexp(1.0, -148));

  ExactSum big;  // more additions than a limb holds between normalizations
  for (int i = 0; i < 1000000; ++i) big.add(FLT_MAX);
  EXPECT_NEAR(big.value() / (1e6 * static_cast<double>(FLT_MAX)), 1.0, 1e-15);
  for (int i = 0; i < 1000000; ++i) big.add(-FLT_MAX);
  EXPECT_EQ(big.value(), 0.0);
}

TEST(ExactSum, NanAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  ExactSum p;
  p.add(1.0f);
  p.add(inf);
  EXPECT_EQ(p.value(), std::numeric_limits<double>::infinity());
  ExactSum n;
  n.add(-inf);
  EXPECT_EQ(n.value(), -std::numeric_limits<double>::infinity());
  p.merge(n);  // +inf and -inf
  EXPECT_TRUE(std::isnan(p.value()));
  ExactSum q;
  q.add(2.0f);
  q.add(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(q.value()));
}

}  // namespace
}  // namespace fanout
