// The real Fashion-MNIST from the Debian package dataset-fashion-mnist, when installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "runtime/data/dataset.h"

namespace fanout::data {
namespace {

void expect_split(const ImageDataset& ds, int64_t n) {
  ASSERT_EQ(ds.images.shape(), (Shape{n, 1, 28, 28}));
  ASSERT_EQ(ds.images.dtype(), DType::U8);
  ASSERT_EQ(ds.labels.shape(), (Shape{n}));
  std::vector<int64_t> count(10, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = ds.labels.data<int32_t>()[i];
    ASSERT_GE(y, 0) << "sample " << i;
    ASSERT_LT(y, 10) << "sample " << i;
    ++count[y];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(count[c], n / 10) << ds.name << " class " << c;
  // Not blank: the pixels use the whole grey range.
  const uint8_t* p = ds.images.data<uint8_t>();
  uint8_t lo = 255, hi = 0;
  for (int64_t k = 0; k < ds.images.numel(); ++k) lo = std::min(lo, p[k]), hi = std::max(hi, p[k]);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 255);
}

TEST(FashionMnistReal, LoadsTheInstalledDataset) {
  const std::string dir = default_fashion_mnist_dir();
  if (!std::filesystem::is_directory(dir))
    GTEST_SKIP() << dir << " is absent (install the Debian package dataset-fashion-mnist)";
  const TrainTest tt = load_fashion_mnist(dir);
  expect_split(tt.train, 60000);
  expect_split(tt.test, 10000);
  EXPECT_EQ(tt.train.sample_shape(), (Shape{1, 28, 28}));
  // The standard constants match the train split's own statistics.
  ASSERT_EQ(tt.train.mean.size(), 1u);
  double s = 0, s2 = 0;
  const uint8_t* p = tt.train.images.data<uint8_t>();
  const int64_t n = tt.train.images.numel();
  for (int64_t k = 0; k < n; ++k) s += p[k] / 255.0, s2 += (p[k] / 255.0) * (p[k] / 255.0);
  const double mean = s / n;
  EXPECT_NEAR(tt.train.mean[0], mean, 1e-3);
  EXPECT_NEAR(tt.train.std[0], std::sqrt(s2 / n - mean * mean), 1e-3);
}

}  // namespace
}  // namespace fanout::data
