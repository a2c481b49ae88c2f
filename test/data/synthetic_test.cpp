// make_synthetic: determinism per (n, seed), split sizes, statistics, and
// classes that differ enough for a small network to learn them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "data/data_test_util.h"
#include "runtime/data/dataset.h"

namespace fanout::data {
namespace {

using fanout::testing::expect_user_error;
using fanout::testing::same_bits;

// Per-class mean images, (10, 3 * 32 * 32), on the [0, 255] scale; counts per class.
std::vector<std::vector<double>> class_means(const ImageDataset& ds, std::vector<int64_t>& count) {
  const int64_t per = 3 * 32 * 32;
  std::vector<std::vector<double>> m(10, std::vector<double>(per, 0.0));
  count.assign(10, 0);
  for (int64_t i = 0; i < ds.size(); ++i) {
    const int c = ds.labels.data<int32_t>()[i];
    ++count[c];
    const uint8_t* x = ds.images.data<uint8_t>() + i * per;
    for (int64_t k = 0; k < per; ++k) m[c][k] += x[k];
  }
  for (int c = 0; c < 10; ++c)
    for (double& v : m[c]) v /= std::max<int64_t>(count[c], 1);
  return m;
}

double rms_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
  return std::sqrt(s / a.size());
}

TEST(Synthetic, ShapesSizesAndLabels) {
  const TrainTest tt = make_synthetic(300, 1);
  EXPECT_EQ(tt.train.images.shape(), (Shape{300, 3, 32, 32}));
  EXPECT_EQ(tt.train.images.dtype(), DType::U8);
  EXPECT_EQ(tt.train.labels.shape(), (Shape{300}));
  EXPECT_EQ(tt.train.labels.dtype(), DType::I32);
  EXPECT_EQ(tt.test.size(), 60);
  EXPECT_EQ(tt.train.sample_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(tt.train.num_classes, 10);
  EXPECT_EQ(tt.train.name, "synthetic/train");
  EXPECT_EQ(tt.test.name, "synthetic/test");
  for (const ImageDataset* ds : {&tt.train, &tt.test})
    for (int64_t i = 0; i < ds->size(); ++i) {
      ASSERT_GE(ds->labels.data<int32_t>()[i], 0);
      ASSERT_LT(ds->labels.data<int32_t>()[i], 10);
    }
  // Small sets still get a test split of at least 10.
  EXPECT_EQ(make_synthetic(1, 1).test.size(), 10);
  EXPECT_EQ(make_synthetic(49, 1).test.size(), 10);
  EXPECT_EQ(make_synthetic(55, 1).test.size(), 11);
}

TEST(Synthetic, SameSeedSameBytes) {
  const TrainTest a = make_synthetic(200, 42), b = make_synthetic(200, 42);
  EXPECT_TRUE(testing::same_data(a.train, b.train));
  EXPECT_TRUE(testing::same_data(a.test, b.test));
}

TEST(Synthetic, DifferentSeedDiffers) {
  const TrainTest a = make_synthetic(200, 42), b = make_synthetic(200, 43);
  EXPECT_FALSE(same_bits(a.train.images, b.train.images));
  EXPECT_FALSE(same_bits(a.train.labels, b.train.labels));
  EXPECT_FALSE(same_bits(a.test.images, b.test.images));
}

TEST(Synthetic, TestSplitIsAnotherStream) {
  const TrainTest tt = make_synthetic(200, 7);
  // The test split is not a prefix of the train split.
  EXPECT_NE(std::memcmp(tt.test.images.raw(), tt.train.images.raw(), 3 * 32 * 32), 0);
  // A larger n extends the train stream: its first samples are the same.
  const TrainTest big = make_synthetic(400, 7);
  EXPECT_EQ(std::memcmp(big.train.images.raw(), tt.train.images.raw(), tt.train.images.nbytes()), 0);
}

TEST(Synthetic, MeanAndStdFromTrainData) {
  const TrainTest tt = make_synthetic(100, 3);
  ASSERT_EQ(tt.train.mean.size(), 3u);
  ASSERT_EQ(tt.train.std.size(), 3u);
  const int64_t hw = 32 * 32;
  for (int c = 0; c < 3; ++c) {
    double s = 0, s2 = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < tt.train.size(); ++i)
      for (int64_t k = 0; k < hw; ++k) {
        const double x = tt.train.images.data<uint8_t>()[(i * 3 + c) * hw + k] / 255.0;
        s += x;
        s2 += x * x;
        ++n;
      }
    const double mean = s / n, std = std::sqrt(s2 / n - mean * mean);
    EXPECT_NEAR(tt.train.mean[c], mean, 1e-5) << "channel " << c;
    EXPECT_NEAR(tt.train.std[c], std, 1e-5) << "channel " << c;
  }
  EXPECT_EQ(tt.test.mean, tt.train.mean);  // the test split is normalized like the train split
  EXPECT_EQ(tt.test.std, tt.train.std);
}

TEST(Synthetic, ClassesDifferAndAreLearnable) {
  const TrainTest tt = make_synthetic(2000, 5);
  std::vector<int64_t> count;
  const auto means = class_means(tt.train, count);
  for (int c = 0; c < 10; ++c) EXPECT_GT(count[c], 120) << "class " << c << " is rare";
  // Every pair of class-mean images differs by much more than grey-level rounding.
  for (int a = 0; a < 10; ++a)
    for (int b = a + 1; b < 10; ++b) EXPECT_GT(rms_diff(means[a], means[b]), 20.0) << "classes " << a << ", " << b;
  // Nearest class mean, fitted on train, classifies the test split well: a
  // linear rule suffices, so a small network learns it quickly.
  int64_t right = 0;
  const int64_t per = 3 * 32 * 32;
  for (int64_t i = 0; i < tt.test.size(); ++i) {
    std::vector<double> x(per);
    for (int64_t k = 0; k < per; ++k) x[k] = tt.test.images.data<uint8_t>()[i * per + k];
    int best = 0;
    for (int c = 1; c < 10; ++c)
      if (rms_diff(x, means[c]) < rms_diff(x, means[best])) best = c;
    right += best == tt.test.labels.data<int32_t>()[i];
  }
  EXPECT_GT(static_cast<double>(right) / tt.test.size(), 0.95);
}

TEST(Synthetic, NeedsAtLeastOneSample) {
  expect_user_error([] { make_synthetic(0, 1); }, {"synthetic", "at least 1"});
  expect_user_error([] { make_synthetic(-5, 1); }, {"synthetic", "got -5"});
}

}  // namespace
}  // namespace fanout::data
