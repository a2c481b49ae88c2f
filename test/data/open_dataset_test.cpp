// open_dataset: the --data spec forms and their one-line errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "data/data_test_util.h"
#include "runtime/data/dataset.h"
#include "runtime/data/open_data.h"

namespace fanout::data {
namespace {

using namespace fanout::testing;  // the data tests' file builders and checks

TEST(OpenDataset, SyntheticDefaultAndSized) {
  const TrainTest d = open_dataset("synthetic", 9);
  EXPECT_EQ(d.train.size(), 2048);
  EXPECT_EQ(d.test.size(), 409);
  const TrainTest s = open_dataset("synthetic:100", 9);
  EXPECT_EQ(s.train.size(), 100);
  EXPECT_EQ(s.test.size(), 20);
  // The seed reaches the generator.
  const TrainTest m = make_synthetic(100, 9);
  EXPECT_EQ(std::memcmp(s.train.images.raw(), m.train.images.raw(), m.train.images.nbytes()), 0);
  EXPECT_EQ(open_dataset("synthetic:1", 9).train.size(), 1);
}

TEST(OpenDataset, BadSyntheticCount) {
  for (const char* spec : {"synthetic:", "synthetic:0", "synthetic:-3", "synthetic:abc", "synthetic:12x",
                           "synthetic: 12", "synthetic:+12", "synthetic:1.5", "synthetic:99999999999999999999999",
                           "synthetic:10000001"}) {
    SCOPED_TRACE(spec);
    expect_user_error([&] { open_dataset(spec, 0); }, {std::string("'") + spec + "'", "synthetic:N", "1..10000000"});
  }
}

TEST(OpenDataset, UnknownKinds) {
  for (const char* spec : {"mnist", "", "Fashion-MNIST", "cifar100:/x", "synthetics", ":synthetic", "fashion_mnist"}) {
    SCOPED_TRACE(spec);
    expect_user_error([&] { open_dataset(spec, 0); },
                      {std::string("unknown dataset '") + spec +
                       "' (expected fashion-mnist[:DIR], cifar10:DIR, synthetic[:N], keypoints3d:DIR or synthetic3d[:N])"});
    // Through open_data (what the tools call), every form.
    expect_user_error([&] { open_data(spec, DataOptions{}); },
                      {std::string("unknown dataset '") + spec +
                       "' (expected fashion-mnist[:DIR], cifar10:DIR, synthetic[:N], keypoints3d:DIR, synthetic3d[:N], "
                       "imagefolder:DIR, wds:DIR, tokens:DIR, text:FILE or text-bytes:FILE)"});
  }
}

TEST(OpenDataset, DirectoryKindsNeedADirectory) {
  expect_user_error([] { open_dataset("cifar10", 0); }, {"'cifar10'", "cifar10:DIR"});
  expect_user_error([] { open_dataset("cifar10:", 0); }, {"'cifar10:'", "cifar10:DIR"});
  expect_user_error([] { open_dataset("fashion-mnist:", 0); }, {"'fashion-mnist:'", "fashion-mnist:DIR"});
}

TEST(OpenDataset, FashionMnistDir) {
  ScratchDir dir;
  write_gz(dir / "train-images-idx3-ubyte.gz", idx_images(3, 2, 2, pattern_pixels(3, 2, 2)));
  write_gz(dir / "train-labels-idx1-ubyte.gz", idx_labels({1, 2, 3}));
  write_file(dir / "t10k-images-idx3-ubyte", idx_images(2, 2, 2, pattern_pixels(2, 2, 2)));
  write_file(dir / "t10k-labels-idx1-ubyte", idx_labels({4, 5}));
  const TrainTest tt = open_dataset("fashion-mnist:" + dir.path().string(), 0);
  EXPECT_EQ(tt.train.size(), 3);
  EXPECT_EQ(tt.test.size(), 2);
  EXPECT_EQ(tt.train.name, "fashion-mnist/train");
  expect_user_error([&] { open_dataset("fashion-mnist:" + (dir / "absent"), 0); },
                    {"fashion-mnist", dir / "absent", "does not exist"});
}

TEST(OpenDataset, Cifar10Dir) {
  ScratchDir dir;
  for (int b = 1; b <= 5; ++b) write_file(dir / ("data_batch_" + std::to_string(b) + ".bin"), cifar_records({1, 2}));
  write_file(dir / "test_batch.bin", cifar_records({3}));
  const TrainTest tt = open_dataset("cifar10:" + dir.path().string(), 0);
  EXPECT_EQ(tt.train.size(), 10);
  EXPECT_EQ(tt.test.size(), 1);
  expect_user_error([&] { open_dataset("cifar10:" + (dir / "absent"), 0); },
                    {"cifar10", dir / "absent", "does not exist"});
}

TEST(OpenDataset, FashionMnistDefaultDirectory) {
  const std::string dir = default_fashion_mnist_dir();
  if (!std::filesystem::is_directory(dir))
    GTEST_SKIP() << dir << " is absent (install the Debian package dataset-fashion-mnist)";
  const TrainTest tt = open_dataset("fashion-mnist", 0);
  EXPECT_EQ(tt.train.size(), 60000);
  EXPECT_EQ(tt.test.size(), 10000);
}

}  // namespace
}  // namespace fanout::data
