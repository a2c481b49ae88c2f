// Landmark heatmaps: the separable renderer against the naive per-voxel loop
// bit for bit (2D and 3D, random landmarks near, across and beyond every
// border, radii 0..7, shared channels, odd non-cubic volumes), exact
// properties of the Gaussian, the merged and batch forms, and the errors.
#include "runtime/data/heatmap.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout::data {
namespace {

using testing::expect_user_error;
using testing::poison;

constexpr float kEps = std::numeric_limits<float>::epsilon();

Tensor landmarks_of(const std::vector<std::vector<float>>& rows) { return testing::f32_rows(rows); }
Tensor channels_of(const std::vector<int32_t>& c) { return testing::i32_values(c); }

// K random landmarks for a volume `vol` ((H, W) or (D, H, W)): mostly inside,
// some within r of a border or across it, some entirely outside, some at
// half-voxel coordinates (where floor(coord + 0.5) rounds up).
Tensor random_landmarks(int64_t k, const std::vector<int64_t>& vol, int r, std::mt19937_64& rng) {
  const int s = static_cast<int>(vol.size());
  Tensor t = Tensor::empty(Shape{k, s});
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t i = 0; i < k; ++i)
    for (int a = 0; a < s; ++a) {
      const float n = static_cast<float>(vol[a]);
      float v = 0;
      switch (rng() % 6) {
        case 0: v = -static_cast<float>(r) - 0.5f + u(rng) * (static_cast<float>(r) + 1.0f); break;  // across 0
        case 1: v = n - 0.5f + u(rng) * (static_cast<float>(r) + 1.0f); break;                       // across n - 1
        case 2: v = (rng() % 2 ? -1.0f : 1.0f) * (n + static_cast<float>(r) + 2.0f + 10.0f * u(rng)); break;  // outside
        case 3: v = static_cast<float>(rng() % vol[a]) + 0.5f; break;  // half voxel
        default: v = -0.49f + u(rng) * n; break;                      // inside
      }
      t.f32()[i * s + a] = v;
    }
  return t;
}

Shape out_shape(int64_t c, const std::vector<int64_t>& vol) {
  return vol.size() == 2 ? Shape{c, vol[0], vol[1]} : Shape{c, vol[0], vol[1], vol[2]};
}

// render_heatmaps and render_heatmaps_naive on the same input, outputs poisoned first.
void expect_same_as_naive(const Tensor& lm, const HeatmapSpec& spec, const Shape& shape, const Tensor& channels) {
  Tensor fast = Tensor::empty(shape), naive = Tensor::empty(shape);
  poison(fast);
  poison(naive);
  render_heatmaps(lm, spec, fast, channels);
  render_heatmaps_naive(lm, spec, naive, channels);
  ASSERT_TRUE(testing::same_bits(fast, naive));
}

double max_of(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max<double>(m, t.f32()[i]);
  return m;
}

TEST(Heatmap, MatchesNaiveBitForBit) {
  std::mt19937_64 rng(11);
  const std::vector<std::vector<int64_t>> volumes = {{7, 13, 11}, {17, 9, 23}, {1, 5, 9}, {19, 31}, {5, 8}, {40, 3}};
  int nonzero = 0;
  for (const auto& vol : volumes)
    for (int r : {0, 1, 2, 7}) {
      for (int trial = 0; trial < 4; ++trial) {
        const int64_t k = 1 + static_cast<int64_t>(rng() % 6);
        const Tensor lm = random_landmarks(k, vol, r, rng);
        SCOPED_TRACE("volume dims " + std::to_string(vol.size()) + " radius " + std::to_string(r) + " trial " +
                     std::to_string(trial));
        HeatmapSpec spec{r, 0};
        expect_same_as_naive(lm, spec, out_shape(k, vol), Tensor());
        // Shared channels (overlaps merge by max), and a narrow sigma that brings the threshold into play.
        std::vector<int32_t> ch(static_cast<size_t>(k));
        for (auto& c : ch) c = static_cast<int32_t>(rng() % 2);
        expect_same_as_naive(lm, spec, out_shape(2, vol), channels_of(ch));
        spec.sigma = 0.45;
        expect_same_as_naive(lm, spec, out_shape(k, vol), Tensor());
        Tensor out = Tensor::empty(out_shape(k, vol));
        render_heatmaps(lm, HeatmapSpec{r, 0}, out);
        nonzero += max_of(out) > 0;
      }
    }
  EXPECT_GT(nonzero, 60);  // the landmarks mostly land in the volume
}

TEST(Heatmap, PeakIsOneAtTheCenterVoxel) {
  // floor(coord + 0.5): 5.3 -> 5, 6.5 -> 7, 4.49 -> 4.
  Tensor out = Tensor::empty(Shape{1, 11, 12, 13});
  render_heatmaps(landmarks_of({{5.3f, 6.5f, 4.49f}}), HeatmapSpec{3, 0}, out);
  const float* o = out.f32();
  EXPECT_EQ(o[(5 * 12 + 7) * 13 + 4], 1.0f);
  int ones = 0;
  for (int64_t i = 0; i < out.numel(); ++i) ones += o[i] == 1.0f;
  EXPECT_EQ(ones, 1);
  EXPECT_EQ(max_of(out), 1.0);
}

TEST(Heatmap, MirrorSymmetricAndZeroOutsideTheWindow) {
  const int r = 4;
  const int64_t d = 15, h = 16, w = 17, cz = 7, cy = 8, cx = 6;
  Tensor out = Tensor::empty(Shape{1, d, h, w});
  poison(out);
  render_heatmaps(landmarks_of({{7.0f, 8.2f, 5.7f}}), HeatmapSpec{r, 0}, out);
  const float* o = out.f32();
  auto at = [&](int64_t z, int64_t y, int64_t x) { return o[(z * h + y) * w + x]; };
  for (int64_t z = 0; z < d; ++z)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        const int64_t dz = z - cz, dy = y - cy, dx = x - cx;
        const bool inside = std::abs(dz) <= r && std::abs(dy) <= r && std::abs(dx) <= r;
        if (!inside) {
          ASSERT_EQ(at(z, y, x), 0.0f) << z << " " << y << " " << x;
          continue;
        }
        ASSERT_GT(at(z, y, x), 0.0f);  // sigma = d / 6 keeps the whole window above the threshold
        // Mirror images along each axis: exactly equal (the factors are even in the offset).
        ASSERT_EQ(at(z, y, x), at(cz - dz, y, x));
        ASSERT_EQ(at(z, y, x), at(z, cy - dy, x));
        ASSERT_EQ(at(z, y, x), at(z, y, cx - dx));
        // Swapped axes: the same value up to the product's rounding.
        ASSERT_NEAR(at(z, y, x), at(cz + dx, cy + dz, cx + dy), 3 * kEps * at(z, y, x));
      }
}

TEST(Heatmap, SigmaIsDiameterOverSix) {
  const int r = 7;  // diameter 15, sigma 2.5
  Tensor out = Tensor::empty(Shape{1, 21, 21, 21});
  render_heatmaps(landmarks_of({{10, 10, 10}}), HeatmapSpec{r, 0}, out);
  const double two_sigma_sq = 2 * 2.5 * 2.5;
  auto at = [&](int z, int y, int x) { return static_cast<double>(out.f32()[((10 + z) * 21 + 10 + y) * 21 + 10 + x]); };
  // One axis: one rounding of the double value.
  EXPECT_NEAR(at(0, 0, 1), std::exp(-1 / two_sigma_sq), 0.5 * kEps * std::exp(-1 / two_sigma_sq));
  EXPECT_NEAR(at(0, 0, 7), std::exp(-49 / two_sigma_sq), 0.5 * kEps * std::exp(-49 / two_sigma_sq));
  // Three axes: within 5 * 2^-24 of exp(-|d|^2 / (2 sigma^2)) (heatmap.h).
  const double want = std::exp(-(1 + 4 + 9) / two_sigma_sq);
  EXPECT_NEAR(at(1, -2, 3), want, 2.5 * kEps * want);
  const double corner = std::exp(-3 * 49 / two_sigma_sq);
  EXPECT_NEAR(at(-7, 7, -7), corner, 2.5 * kEps * corner);
}

TEST(Heatmap, ThresholdIsEpsilonTimesThePeak) {
  // sigma 0.6 on radius 5: the window's far voxels fall below FLT_EPSILON and are 0.
  const double sigma = 0.6, two_sigma_sq = 2 * sigma * sigma;
  Tensor out = Tensor::empty(Shape{1, 11, 11});
  render_heatmaps(landmarks_of({{5, 5}}), HeatmapSpec{5, sigma}, out);
  int zeroed = 0, kept = 0;
  for (int y = 0; y < 11; ++y)
    for (int x = 0; x < 11; ++x) {
      const double exact = std::exp(-((y - 5) * (y - 5) + (x - 5) * (x - 5)) / two_sigma_sq);
      const float v = out.f32()[y * 11 + x];
      if (exact < kEps * 0.999) {
        EXPECT_EQ(v, 0.0f) << y << " " << x;
        ++zeroed;
      } else if (exact > kEps * 1.001) {
        EXPECT_NEAR(v, exact, 2 * kEps * exact) << y << " " << x;
        ++kept;
      }
    }
  EXPECT_GT(zeroed, 20);
  EXPECT_GT(kept, 20);
}

TEST(Heatmap, RadiusZeroIsOneVoxel) {
  Tensor out = Tensor::empty(Shape{2, 4, 5, 6});
  poison(out);
  render_heatmaps(landmarks_of({{1.6f, 0.2f, 5.4f}, {-0.6f, 2, 2}}), HeatmapSpec{0, 0}, out);
  for (int64_t i = 0; i < out.numel(); ++i)
    EXPECT_EQ(out.f32()[i], i == (2 * 5 + 0) * 6 + 5 ? 1.0f : 0.0f) << i;  // the second one is outside (z = -1)
}

TEST(Heatmap, LandmarkOutsideDrawsItsClippedWindow) {
  // x = -2.2 -> center -2; radius 3 reaches x = 0 (offset 2) and x = 1 (offset 3).
  Tensor out = Tensor::empty(Shape{1, 5, 6});
  Tensor inside = Tensor::empty(Shape{1, 5, 12});
  render_heatmaps(landmarks_of({{2, -2.2f}}), HeatmapSpec{3, 0}, out);
  render_heatmaps(landmarks_of({{2, 3.8f}}), HeatmapSpec{3, 0}, inside);  // the same window, shifted by 6
  for (int y = 0; y < 5; ++y)
    for (int x = 0; x < 6; ++x) EXPECT_EQ(out.f32()[y * 6 + x], inside.f32()[y * 12 + x + 6]) << y << " " << x;
  EXPECT_GT(out.f32()[2 * 6 + 1], 0.0f);
  EXPECT_EQ(out.f32()[2 * 6 + 2], 0.0f);
}

TEST(Heatmap, SharedChannelIsTheMaximum) {
  std::mt19937_64 rng(5);
  const std::vector<int64_t> vol = {9, 14, 10};
  const Tensor lm = random_landmarks(4, vol, 3, rng);
  Tensor each = Tensor::empty(out_shape(4, vol)), shared = Tensor::empty(out_shape(2, vol));
  const HeatmapSpec spec{3, 0};
  render_heatmaps(lm, spec, each);
  render_heatmaps(lm, spec, shared, channels_of({1, 0, 1, 1}));
  const int64_t v = 9 * 14 * 10;
  for (int64_t i = 0; i < v; ++i) {
    const float* e = each.f32();
    ASSERT_EQ(shared.f32()[i], e[v + i]);
    ASSERT_EQ(shared.f32()[v + i], std::max({e[i], e[2 * v + i], e[3 * v + i]}));
  }
}

TEST(Heatmap, MergedAndBatchForms) {
  std::mt19937_64 rng(9);
  const std::vector<int64_t> vol = {6, 11, 7};
  const HeatmapSpec spec{2, 0};
  const Tensor batch_lm = testing::random_tensor(Shape{3, 5, 3}, rng, -2.0f, 12.0f);  // (N, K, 3)
  Tensor batch = Tensor::empty(Shape{3, 5, 6, 11, 7});
  poison(batch);
  render_heatmaps_batch(batch_lm, spec, batch);
  const int64_t sample = 5 * 6 * 11 * 7;
  for (int64_t n = 0; n < 3; ++n) {
    const Tensor lm = batch_lm.slice(n, n + 1).view(Shape{5, 3});
    Tensor one = Tensor::empty(Shape{5, 6, 11, 7});
    render_heatmaps(lm, spec, one);
    ASSERT_EQ(std::memcmp(one.raw(), batch.f32() + n * sample, one.nbytes()), 0) << "sample " << n;
    Tensor merged = Tensor::empty(Shape{6, 11, 7});
    poison(merged);
    render_heatmap_merged(lm, spec, merged);
    for (int64_t i = 0; i < merged.numel(); ++i) {
      float m = 0;
      for (int64_t k = 0; k < 5; ++k) m = std::max(m, one.f32()[k * merged.numel() + i]);
      ASSERT_EQ(merged.f32()[i], m);
    }
  }
  EXPECT_GT(max_of(batch), 0.0);
  // Shared channels in a batch.
  Tensor two = Tensor::empty(Shape{3, 2, 6, 11, 7});
  render_heatmaps_batch(batch_lm, spec, two, channels_of({0, 1, 0, 1, 1}));
  Tensor one = Tensor::empty(Shape{2, 6, 11, 7});
  render_heatmaps(batch_lm.slice(2, 3).view(Shape{5, 3}), spec, one, channels_of({0, 1, 0, 1, 1}));
  EXPECT_EQ(std::memcmp(one.raw(), two.f32() + 2 * one.numel(), one.nbytes()), 0);
}

TEST(Heatmap, NoLandmarksIsAllZero) {
  Tensor out = Tensor::empty(Shape{3, 4, 5});
  poison(out);
  render_heatmaps(Tensor::empty(Shape{0, 2}), HeatmapSpec{2, 0}, out, channels_of({}));
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.f32()[i], 0.0f);
}

TEST(Heatmap, Errors) {
  const Tensor lm = landmarks_of({{1, 2, 3}});
  Tensor out = Tensor::empty(Shape{1, 4, 5, 6});
  const HeatmapSpec spec{2, 0};
  expect_user_error([&] { render_heatmaps(lm, HeatmapSpec{-1, 0}, out); }, {"render_heatmaps", "radius -1"});
  expect_user_error([&] { render_heatmaps(lm, HeatmapSpec{kMaxHeatmapRadius + 1, 0}, out); }, {"radius"});
  expect_user_error([&] { render_heatmaps(lm, HeatmapSpec{2, -1}, out); }, {"sigma -1"});
  expect_user_error([&] { render_heatmaps(lm, HeatmapSpec{2, std::nan("")}, out); }, {"sigma"});
  expect_user_error([&] { render_heatmaps(landmarks_of({{1, 2}}), spec, out); },
                    {"landmarks (1, 2) must be (K, 3) for out (1, 4, 5, 6)"});
  expect_user_error([&] { render_heatmaps(lm, spec, Tensor::empty(Shape{1, 4})); }, {"out (1, 4) must be"});
  expect_user_error([&] { render_heatmaps(lm, spec, Tensor::empty(Shape{2, 4, 5, 6})); },
                    {"2 channels for 1 landmarks"});
  expect_user_error([&] { render_heatmaps(lm, spec, Tensor::empty(Shape{1, 4, 5, 6}, DType::F64)); },
                    {"out must be float32"});
  expect_user_error([&] { render_heatmaps(landmarks_of({{1, std::nanf(""), 3}}), spec, out); },
                    {"landmark 0 has a non-finite coordinate"});
  expect_user_error([&] { render_heatmaps(landmarks_of({{1, 2, 3}, {1, 2, INFINITY}}), spec, out, channels_of({0, 0})); },
                    {"landmark 1 has a non-finite coordinate"});
  expect_user_error([&] { render_heatmaps(lm, spec, out, channels_of({1})); }, {"landmark 0 has channel 1, outside 0..0"});
  expect_user_error([&] { render_heatmaps(lm, spec, out, channels_of({0, 0})); }, {"channels must be"});
  expect_user_error([&] { render_heatmap_merged(lm, spec, out); }, {"render_heatmap_merged", "(H, W) or (D, H, W)"});
  expect_user_error([&] { render_heatmaps_batch(lm, spec, Tensor::empty(Shape{2, 1, 4, 5, 6})); },
                    {"render_heatmaps_batch", "(N, K, 3)"});
  expect_user_error(
      [&] { render_heatmaps_batch(Tensor::empty(Shape{3, 1, 3}), spec, Tensor::empty(Shape{2, 1, 4, 5, 6})); },
      {"different batch sizes"});
}

}  // namespace
}  // namespace fanout::data
