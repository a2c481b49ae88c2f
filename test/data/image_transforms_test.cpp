// Image transforms against their definitions: the antialiased bilinear
// resize against a float64 triangle-filter reference written here (and
// against Pillow itself in data.image_python_interop);
// RandomResizedCrop's boxes against torchvision's distribution (scale and
// log-ratio uniform) and fallback; Resize's and CenterCrop's sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/data/image_transforms.h"

namespace fanout::data {
namespace {

Image random_image(int h, int w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Image im;
  im.height = h;
  im.width = w;
  im.rgb.resize(static_cast<size_t>(h) * w * 3);
  for (auto& v : im.rgb) v = static_cast<uint8_t>(rng() >> 56);
  return im;
}

// Weights of an antialiased triangle filter from its definition: output
// pixel o of n over an input of `in` pixels; input pixel j (centre j + 0.5)
// weighs max(0, 1 - |j + 0.5 - c| / f), c = (o + 0.5) * in / n, f = max(in / n, 1),
// normalized to sum 1.
std::vector<double> triangle(int in, int n, int o) {
  const double scale = static_cast<double>(in) / n, f = std::max(scale, 1.0), c = (o + 0.5) * scale;
  std::vector<double> w(static_cast<size_t>(in));
  double sum = 0;
  for (int j = 0; j < in; ++j) sum += w[static_cast<size_t>(j)] = std::max(0.0, 1.0 - std::abs(j + 0.5 - c) / f);
  for (auto& v : w) v /= sum;
  return w;
}

TEST(ImageTransforms, BilinearResizeWithinOneLevelOfTheFloat64Filter) {
  const Image src = random_image(61, 83, 7);
  struct Case {
    CropBox box;
    int oh, ow;
  };
  const Case cases[] = {{{0, 0, 61, 83}, 20, 27},  {{0, 0, 61, 83}, 40, 55},  {{0, 0, 61, 83}, 122, 166},
                        {{5, 9, 31, 44}, 31, 44},  {{5, 9, 31, 44}, 64, 17},  {{60, 82, 1, 1}, 3, 5},
                        {{3, 2, 50, 70}, 224, 224}, {{0, 0, 61, 83}, 1, 1}};
  for (const auto& c : cases) {
    std::vector<uint8_t> got(static_cast<size_t>(c.oh) * c.ow * 3);
    resize_bilinear(src, c.box, c.oh, c.ow, got.data());
    int worst = 0;
    for (int y = 0; y < c.oh; ++y) {
      const auto wy = triangle(c.box.height, c.oh, y);
      for (int x = 0; x < c.ow; ++x) {
        const auto wx = triangle(c.box.width, c.ow, x);
        for (int ch = 0; ch < 3; ++ch) {
          double ref = 0;
          for (int i = 0; i < c.box.height; ++i)
            for (int j = 0; j < c.box.width; ++j)
              ref += wy[static_cast<size_t>(i)] * wx[static_cast<size_t>(j)] *
                     src.rgb[(static_cast<size_t>(c.box.top + i) * src.width + c.box.left + j) * 3 + ch];
          const int g = got[(static_cast<size_t>(y) * c.ow + x) * 3 + ch];
          worst = std::max(worst, static_cast<int>(std::ceil(std::abs(g - ref) - 1e-9)));
          ASSERT_LE(std::abs(g - ref), 1.0) << "box (" << c.box.top << "," << c.box.left << "," << c.box.height
                                            << "," << c.box.width << ") to " << c.oh << "x" << c.ow << " at (" << y
                                            << "," << x << "," << ch << ")";
        }
      }
    }
    // Pillow's two passes round twice: at most half a level each.
    EXPECT_LE(worst, 1);
  }
}

// Kolmogorov-Smirnov distance of samples from the uniform distribution on [lo, hi).
double ks_uniform(std::vector<double> v, double lo, double hi) {
  std::sort(v.begin(), v.end());
  double d = 0;
  const double n = static_cast<double>(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double cdf = (v[i] - lo) / (hi - lo);
    d = std::max({d, std::abs(cdf - i / n), std::abs(cdf - (i + 1) / n)});
  }
  return d;
}

TEST(ImageTransforms, RandomResizedCropFollowsTorchvisionsDistribution) {
  // A square image where every box of area fraction up to 0.5 fits, so no draw is
  // refused: the boxes' area fraction is uniform on [0.08, 0.5] and their log aspect
  // ratio uniform on [log 3/4, log 4/3] (up to the rounding of 3000-pixel sides).
  const int side = 3000, n = 20000;
  std::mt19937_64 rng(3);
  std::vector<double> scales, log_ratios, tops, lefts;
  for (int i = 0; i < n; ++i) {
    const CropBox b = random_resized_crop_box(side, side, 0.08, 0.5, 3.0 / 4, 4.0 / 3, rng);
    ASSERT_TRUE(b.top >= 0 && b.left >= 0 && b.top + b.height <= side && b.left + b.width <= side);
    scales.push_back(static_cast<double>(b.height) * b.width / (double(side) * side));
    log_ratios.push_back(std::log(static_cast<double>(b.width) / b.height));
    if (b.height < side) tops.push_back((b.top + 0.5) / (side - b.height + 1));
    if (b.width < side) lefts.push_back((b.left + 0.5) / (side - b.width + 1));
  }
  // 1.95 / sqrt(n): the KS statistic's 0.1% critical value.
  const double crit = 1.95 / std::sqrt(static_cast<double>(n));
  EXPECT_LT(ks_uniform(scales, 0.08, 0.5), crit);
  EXPECT_LT(ks_uniform(log_ratios, std::log(3.0 / 4), std::log(4.0 / 3)), crit);
  EXPECT_LT(ks_uniform(tops, 0, 1), crit);
  EXPECT_LT(ks_uniform(lefts, 0, 1), crit);
}

TEST(ImageTransforms, RandomResizedCropFallsBackToTheCentralBoxAfterTenTries) {
  // 400x100 (ratio 4): a box of the whole area never fits at a ratio in [3/4, 4/3];
  // the fallback is the full height at ratio 4/3, centred: width round(133.33) = 133.
  std::mt19937_64 rng(1);
  EXPECT_EQ(random_resized_crop_box(100, 400, 1.0, 1.0, 3.0 / 4, 4.0 / 3, rng), (CropBox{0, 133, 100, 133}));
  // Too tall (ratio 1/4): the full width at ratio 3/4: height round(133.33) = 133.
  EXPECT_EQ(random_resized_crop_box(400, 100, 1.0, 1.0, 3.0 / 4, 4.0 / 3, rng), (CropBox{133, 0, 133, 100}));
  // Ratio 10/9 above [0.9, 0.95]: the full height at 0.95, width round(85.5) = 86 (half to even).
  EXPECT_EQ(random_resized_crop_box(90, 100, 1.0, 1.0, 0.9, 0.95, rng), (CropBox{0, 7, 90, 86}));
  // The image's ratio inside the range, but no drawn ratio is exactly 1: the whole image.
  EXPECT_EQ(random_resized_crop_box(100, 100, 1.0, 1.0, 0.5, 2.0, rng), (CropBox{0, 0, 100, 100}));
  // The draws depend on the generator alone.
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(random_resized_crop_box(375, 500, 0.08, 1, 0.75, 4.0 / 3, a),
              random_resized_crop_box(375, 500, 0.08, 1, 0.75, 4.0 / 3, b));
}

TEST(ImageTransforms, ResizeAndCenterCropSizesAsTorchvision) {
  int h = 0, w = 0;
  shorter_side_size(375, 500, 256, h, w);
  EXPECT_EQ(h, 256);
  EXPECT_EQ(w, 341);  // int(256 * 500 / 375) = int(341.33)
  shorter_side_size(500, 333, 224, h, w);
  EXPECT_EQ(h, 336);  // int(224 * 500 / 333) = int(336.3)
  EXPECT_EQ(w, 224);
  EXPECT_EQ(center_crop_box(256, 341, 224), (CropBox{16, 58, 224, 224}));  // round(58.5) = 58, half to even
  EXPECT_EQ(center_crop_box(257, 300, 224), (CropBox{16, 38, 224, 224}));  // round(16.5) = 16
  EXPECT_EQ(center_crop_box(5, 300, 8), (CropBox{-1, 146, 8, 8}));        // padded by (8 - 5) // 2 = 1 on top
  // crop_padded places the image after that padding, zeros around it.
  const Image src = random_image(5, 6, 9);
  std::vector<uint8_t> out(8 * 8 * 3);
  crop_padded(src, center_crop_box(5, 6, 8), out.data());
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) {
      const int sy = y - 1, sx = x - 1;
      const bool inside = sy >= 0 && sy < 5 && sx >= 0 && sx < 6;
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(out[(static_cast<size_t>(y) * 8 + x) * 3 + c],
                  inside ? src.rgb[(static_cast<size_t>(sy) * 6 + sx) * 3 + c] : 0);
    }
}

}  // namespace
}  // namespace fanout::data
