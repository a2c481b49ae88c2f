// Dropout on every backend: against its definition (each element zero or
// x / (1 - p), the zeros where the hash says, in float64), the share dropped
// within 6 standard deviations of p, p = 0 the identity and p = 1 zeros, a
// batch split by rows (each part with its first row) draws what the whole
// batch draws, another key another mask, and in place; low-type storage in
// either format drops the elements float32 drops (the logical index) and
// rounds the kept ones once.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <cmath>

#include "kernels/backend_test_util.h"
#include "kernels/dropout.h"
#include "kernels/storage_test_util.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

FANOUT_BACKEND_SUITE(DropoutOnBackend);

// The mask's definition, written out: a 24-bit draw from the hash of (key, row, element) against p.
bool kept(uint64_t key, int64_t row, int64_t e, float p) {
  const uint64_t h = splitmix64(splitmix64(key ^ splitmix64(static_cast<uint64_t>(row))) ^ static_cast<uint64_t>(e));
  return static_cast<double>(h >> 40) / 16777216.0 >= static_cast<double>(p);
}

TEST_P(DropoutOnBackend, MatchesItsDefinitionAndDropsAShareOfP) {
  std::mt19937_64 rng(91);
  const Shape s{50, 4, 500};  // 100,000 elements
  Tensor x = ft::random_tensor(s, rng, 0.5f, 2.0f);  // never zero: a zero output is a dropped element
  for (float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    Tensor y = poisoned(s);
    kernels::dropout(ctx(), up(x), p, 12345, 7, 1, y);
    const Tensor h = down(y);
    const double scale = 1.0 / (1.0 - static_cast<double>(p));
    int64_t dropped = 0;
    for (int64_t i = 0; i < h.numel(); ++i) {
      const int64_t r = i / 2000, e = i % 2000;
      const bool keep = kept(12345, 7 + r, e, p);
      if (!keep) {
        ASSERT_EQ(h.f32()[i], 0.0f) << i;
        ++dropped;
      } else {
        ASSERT_NEAR(h.f32()[i], x.f32()[i] * scale, 1e-6 * x.f32()[i] * scale) << i;
      }
    }
    const double n = static_cast<double>(h.numel()), share = dropped / n;
    EXPECT_NEAR(share, p, 6 * std::sqrt(p * (1 - p) / n));
  }
}

TEST_P(DropoutOnBackend, ZeroIsTheIdentityAndOneDropsEverything) {
  std::mt19937_64 rng(92);
  Tensor x = ft::random_tensor(Shape{3, 17}, rng);
  Tensor y0 = poisoned(x.shape()), y1 = poisoned(x.shape());
  kernels::dropout(ctx(), up(x), 0.0f, 5, 0, 1, y0);
  kernels::dropout(ctx(), up(x), 1.0f, 5, 0, 1, y1);
  EXPECT_TRUE(ft::same_bits(down(y0), x));
  EXPECT_EQ(ft::l2_norm(down(y1)), 0.0);
}

TEST_P(DropoutOnBackend, SplitRowsDrawTheWholeBatchsMask) {  // contiguous (replicas) and strided (ranks)
  std::mt19937_64 rng(93);
  Tensor x = ft::random_tensor(Shape{8, 3, 5}, rng);
  Tensor whole = poisoned(x.shape());
  kernels::dropout(ctx(), up(x), 0.4f, 99, 0, 1, whole);
  Tensor top = poisoned(Shape{3, 3, 5}), bottom = poisoned(Shape{5, 3, 5});
  kernels::dropout(ctx(), up(x.slice(0, 3).to(Device::cpu())), 0.4f, 99, 0, 1, top);
  kernels::dropout(ctx(), up(x.slice(3, 8).to(Device::cpu())), 0.4f, 99, 3, 1, bottom);
  const Tensor w = down(whole);
  EXPECT_TRUE(ft::same_bits(down(top), w.slice(0, 3).to(Device::cpu())));
  EXPECT_TRUE(ft::same_bits(down(bottom), w.slice(3, 8).to(Device::cpu())));
  Tensor other = poisoned(x.shape());
  kernels::dropout(ctx(), up(x), 0.4f, 100, 0, 1, other);
  EXPECT_FALSE(ft::same_bits(down(other), w)) << "another key, another mask";
  Tensor in_place = up(x);
  kernels::dropout(ctx(), in_place, 0.4f, 99, 0, 1, in_place);
  EXPECT_TRUE(ft::same_bits(down(in_place), w));
  // DDP's ranks: rank r of 3 holds rows r, r + 3, ... of the whole batch (DistributedSampler's deal).
  for (int r = 0; r < 3; ++r) {
    std::vector<Tensor> rows;
    for (int64_t i = r; i < 8; i += 3) rows.push_back(x.slice(i, i + 1).to(Device::cpu()));
    Tensor mine = Tensor::empty(Shape{static_cast<int64_t>(rows.size()), 3, 5});
    for (size_t k = 0; k < rows.size(); ++k) std::memcpy(mine.f32() + k * 15, rows[k].f32(), 15 * sizeof(float));
    Tensor got = poisoned(mine.shape());
    kernels::dropout(ctx(), up(mine), 0.4f, 99, r, 3, got);
    const Tensor g = down(got);
    for (size_t k = 0; k < rows.size(); ++k)
      EXPECT_TRUE(ft::same_bits(g.slice(int64_t(k), int64_t(k) + 1).to(Device::cpu()),
                                w.slice(r + 3 * int64_t(k), r + 3 * int64_t(k) + 1).to(Device::cpu())))
          << "rank " << r << ", its row " << k;
  }
}

TEST_P(DropoutOnBackend, LowStorageInEitherFormatDropsWhatFloat32Drops) {
  const Shape s{4, 6, 5, 7};
  for (const ft::StorageCase& sc : ft::low_storage_cases()) {
    SCOPED_TRACE(sc.name());
    std::mt19937_64 rng(94);
    const Tensor x = ft::random_stored(s, sc.dtype, sc.format, rng, 0.5f, 2.0f);  // never zero
    Tensor y = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    kernels::dropout(ctx(), up(x), 0.3f, 4242, 5, 1, y);
    const Tensor got = down(y);
    const int64_t sample = x.numel() / s[0];
    const double scale = 1.0 / (1.0 - 0.3), u = ft::unit_roundoff(sc.dtype) * (1 + 1e-3);
    int64_t dropped = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {  // i is the logical index
      const bool keep = kept(4242, 5 + i / sample, i % sample, 0.3f);
      const double want = keep ? ft::stored(x, i) * scale : 0.0;
      ASSERT_NEAR(ft::stored(got, i), want, u * want + 1e-6 * want) << i;
      dropped += !keep;
    }
    EXPECT_GT(dropped, 0);
    EXPECT_LT(dropped, x.numel());
  }
}

TEST_P(DropoutOnBackend, RefusesBadArguments) {
  Tensor x = up(Tensor::zeros(Shape{2, 3})), y = up(Tensor::zeros(Shape{2, 4}));
  EXPECT_THROW(kernels::dropout(ctx(), x, 0.5f, 1, 0, 1, y), Error);
  EXPECT_THROW(kernels::dropout(ctx(), x, 1.5f, 1, 0, 1, x), Error);
  EXPECT_THROW(kernels::dropout(ctx(), x, 0.5f, 1, 0, 0, x), Error) << "a row stride of 0";
}

}  // namespace
}  // namespace fanout
