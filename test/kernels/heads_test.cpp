// Attention heads in and out of token rows on every backend: every element
// lands where the index formula says (float32 and bfloat16 bits), columns
// outside the heads stay untouched, the two directions invert each other,
// rows append into a longer heads tensor (a key-value cache) from a given
// position leaving its other positions alone, and bad shapes are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "kernels/backend_test_util.h"
#include "kernels/heads.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

FANOUT_BACKEND_SUITE(HeadsOnBackend);

TEST_P(HeadsOnBackend, MovesEveryElementByTheFormula) {
  struct Case {
    int64_t b, t, c, h, d, offset;
  };
  const Case cases[] = {{2, 7, 48, 4, 4, 16}, {1, 1, 3, 1, 1, 2}, {3, 64, 192, 2, 32, 128}, {2, 5, 40, 3, 8, 0}};
  std::mt19937_64 rng(5);
  for (const Case& cs : cases) {
    SCOPED_TRACE("B " + std::to_string(cs.b) + " T " + std::to_string(cs.t) + " C " + std::to_string(cs.c) +
                 " H " + std::to_string(cs.h) + " D " + std::to_string(cs.d) + " at " + std::to_string(cs.offset));
    const Shape rs{cs.b, cs.t, cs.c}, hs{cs.b, cs.h, cs.t, cs.d};
    Tensor rows = ft::random_tensor(rs, rng), heads = ft::random_tensor(hs, rng);
    Tensor got_heads = poisoned(hs), rows_d = up(rows);
    kernels::heads_from_rows(ctx(), rows_d, cs.offset, got_heads);
    Tensor into = up(rows);  // heads_to_rows writes only the heads' columns
    kernels::heads_to_rows(ctx(), up(heads), cs.offset, into);
    const Tensor gh = down(got_heads), gr = down(into);
    for (int64_t bi = 0; bi < cs.b; ++bi)
      for (int64_t ti = 0; ti < cs.t; ++ti)
        for (int64_t col = 0; col < cs.c; ++col) {
          const int64_t r = (bi * cs.t + ti) * cs.c + col, rel = col - cs.offset;
          if (rel >= 0 && rel < cs.h * cs.d) {
            const int64_t hi = rel / cs.d, di = rel % cs.d, k = ((bi * cs.h + hi) * cs.t + ti) * cs.d + di;
            ASSERT_EQ(gh.f32()[k], rows.f32()[r]) << "heads element " << k;
            ASSERT_EQ(gr.f32()[r], heads.f32()[k]) << "rows element " << r;
          } else {
            ASSERT_EQ(gr.f32()[r], rows.f32()[r]) << "column " << col << " outside the heads was written";
          }
        }
    // Round trip: rows -> heads -> rows gives the same bits.
    Tensor back = poisoned(rs);
    kernels::heads_to_rows(ctx(), got_heads, 0 + cs.offset, back);
    Tensor b = down(back);
    for (int64_t bi = 0; bi < cs.b * cs.t; ++bi)
      for (int64_t col = cs.offset; col < cs.offset + cs.h * cs.d; ++col)
        ASSERT_EQ(b.f32()[bi * cs.c + col], rows.f32()[bi * cs.c + col]);
  }
}

TEST_P(HeadsOnBackend, CopiesTwoByteElementsAsTheyAre) {
  std::mt19937_64 rng(6);
  const Shape rs{2, 3, 12}, hs{2, 2, 3, 6};
  Tensor rows = Tensor::empty(rs, DType::BF16);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (int64_t i = 0; i < rows.numel(); ++i) rows.data<uint16_t>()[i] = static_cast<uint16_t>(bits(rng));
  Tensor heads = up(Tensor::zeros(hs, DType::BF16));
  kernels::heads_from_rows(ctx(), up(rows), 0, heads);
  const Tensor h = down(heads);
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int64_t d = i % 6, t = (i / 6) % 3, hh = (i / 18) % 2, b = i / 36;
    ASSERT_EQ(h.data<uint16_t>()[i], rows.data<uint16_t>()[(b * 3 + t) * 12 + hh * 6 + d]) << "element " << i;
  }
}

// rows (B, T, C) into heads (B, H, Th, D) at positions [t0, t0 + T): those
// elements by the formula, every other position's bits as they were.
TEST_P(HeadsOnBackend, AppendsFromAPositionLeavingTheOthers) {
  struct Case {
    int64_t b, t, c, h, th, d, offset, t0;
  };
  const Case cases[] = {{2, 3, 30, 2, 8, 6, 12, 4}, {1, 1, 16, 4, 5, 4, 0, 4}, {3, 5, 9, 1, 5, 3, 6, 0},
                        {2, 2, 64, 2, 9, 16, 32, 1}};
  std::mt19937_64 rng(7);
  for (DType dt : {DType::F32, DType::BF16})
    for (const Case& cs : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(cs.t) + " into " + std::to_string(cs.th) +
                   " from " + std::to_string(cs.t0));
      const Shape rs{cs.b, cs.t, cs.c}, hs{cs.b, cs.h, cs.th, cs.d};
      Tensor rows = Tensor::empty(rs, dt), heads = Tensor::empty(hs, dt);
      const size_t es = dtype_size(dt);
      std::uniform_int_distribution<int> byte(0, 255);
      for (Tensor* x : {&rows, &heads}) {
        auto* p = static_cast<unsigned char*>(x->raw());
        for (size_t i = 0; i < x->nbytes(); ++i) p[i] = static_cast<unsigned char>(byte(rng));
      }
      Tensor into = up(heads);
      kernels::heads_from_rows(ctx(), up(rows), cs.offset, into, cs.t0);
      const Tensor got = down(into);
      const auto* g = static_cast<const unsigned char*>(got.raw());
      const auto* before = static_cast<const unsigned char*>(heads.raw());
      const auto* r = static_cast<const unsigned char*>(rows.raw());
      for (int64_t k = 0; k < heads.numel(); ++k) {
        const int64_t di = k % cs.d, pos = (k / cs.d) % cs.th, hi = (k / (cs.d * cs.th)) % cs.h,
                      bi = k / (cs.d * cs.th * cs.h);
        const bool written = pos >= cs.t0 && pos < cs.t0 + cs.t;
        const unsigned char* want =
            written ? r + static_cast<size_t>((bi * cs.t + pos - cs.t0) * cs.c + cs.offset + hi * cs.d + di) * es
                    : before + static_cast<size_t>(k) * es;
        ASSERT_EQ(std::memcmp(g + static_cast<size_t>(k) * es, want, es), 0)
            << "heads element " << k << (written ? " (written)" : " (outside the rows' positions)");
      }
    }
}

TEST_P(HeadsOnBackend, RefusesShapesThatDoNotFit) {
  Tensor rows = up(Tensor::zeros(Shape{2, 3, 8})), heads = up(Tensor::zeros(Shape{2, 2, 3, 4}));
  EXPECT_THROW(kernels::heads_from_rows(ctx(), rows, 1, heads), Error);  // 1 + 8 > 8 columns
  EXPECT_THROW(kernels::heads_from_rows(ctx(), rows, 0, heads, 1), Error);  // positions 1 + 3 > 3
  Tensor short_t = up(Tensor::zeros(Shape{2, 2, 2, 4}));
  EXPECT_THROW(kernels::heads_from_rows(ctx(), rows, 0, short_t), Error);
  Tensor long_t = up(Tensor::zeros(Shape{2, 2, 4, 4}));
  EXPECT_THROW(kernels::heads_from_rows(ctx(), rows, 0, long_t), Error);  // no position given: T must agree
  EXPECT_THROW(kernels::heads_from_rows(ctx(), rows, 0, long_t, -2), Error);
  kernels::heads_from_rows(ctx(), rows, 0, long_t, 1);  // fits: positions [1, 4)
  kernels::heads_from_rows(ctx(), rows, 0, long_t, 0);  // and [0, 3)
  EXPECT_THROW(kernels::heads_to_rows(ctx(), long_t, 0, rows), Error);  // rows hold T = 3 positions, not 4
  Tensor bf = up(Tensor::zeros(Shape{2, 2, 3, 4}, DType::BF16));
  EXPECT_THROW(kernels::heads_to_rows(ctx(), bf, 0, rows), Error);  // dtypes differ
}

}  // namespace
}  // namespace fanout
