// load_cifar10 on small batch files written here: concatenation order, values,
// and one-line errors for missing files, partial records and bad labels.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/data_test_util.h"
#include "runtime/data/dataset.h"

namespace fanout::data {
namespace {

using namespace fanout::testing;  // the data tests' file builders and checks

// Batch b (1..5, 0 = test) holds labels[b]; each batch's pixels are salted by b.
const std::vector<std::vector<uint8_t>> kLabels = {{9, 8}, {0, 1, 2}, {3}, {4, 5}, {6, 7, 8, 9}, {0}};

std::string batch_name(int b) { return b == 0 ? "test_batch.bin" : "data_batch_" + std::to_string(b) + ".bin"; }

void write_batches(const ScratchDir& dir) {
  for (int b = 0; b <= 5; ++b) write_file(dir / batch_name(b), cifar_records(kLabels[b], b));
}

// Checks ds against the records of batches `batches`, concatenated in order.
void expect_batches(const ImageDataset& ds, const std::vector<int>& batches) {
  int64_t n = 0;
  for (int b : batches) n += static_cast<int64_t>(kLabels[b].size());
  ASSERT_EQ(ds.images.shape(), (Shape{n, 3, 32, 32}));
  ASSERT_EQ(ds.images.dtype(), DType::U8);
  ASSERT_EQ(ds.labels.shape(), (Shape{n}));
  EXPECT_EQ(ds.sample_shape(), (Shape{3, 32, 32}));
  EXPECT_EQ(ds.num_classes, 10);
  int64_t i = 0;
  for (int b : batches)
    for (size_t r = 0; r < kLabels[b].size(); ++r, ++i) {
      ASSERT_EQ(ds.labels.data<int32_t>()[i], kLabels[b][r]) << "sample " << i;
      const uint8_t* img = ds.images.data<uint8_t>() + i * 3072;
      for (int64_t k = 0; k < 3072; ++k)
        ASSERT_EQ(img[k], cifar_pixel(kLabels[b][r], b, static_cast<int64_t>(r), k)) << "sample " << i << " byte " << k;
    }
}

TEST(LoadCifar10, ReadsAndConcatenatesBatches) {
  ScratchDir dir;
  write_batches(dir);
  const TrainTest tt = load_cifar10(dir.path().string());
  expect_batches(tt.train, {1, 2, 3, 4, 5});
  expect_batches(tt.test, {0});
  EXPECT_EQ(tt.train.name, "cifar10/train");
  EXPECT_EQ(tt.test.name, "cifar10/test");
  for (const ImageDataset* ds : {&tt.train, &tt.test}) {
    ASSERT_EQ(ds->mean.size(), 3u);
    ASSERT_EQ(ds->std.size(), 3u);
    EXPECT_FLOAT_EQ(ds->mean[0], 0.4914f);
    EXPECT_FLOAT_EQ(ds->mean[1], 0.4822f);
    EXPECT_FLOAT_EQ(ds->mean[2], 0.4465f);
    EXPECT_FLOAT_EQ(ds->std[0], 0.2470f);
    EXPECT_FLOAT_EQ(ds->std[1], 0.2435f);
    EXPECT_FLOAT_EQ(ds->std[2], 0.2616f);
  }
}

TEST(LoadCifar10, SizeNotWholeRecords) {
  ScratchDir dir;
  write_batches(dir);
  Bytes b = cifar_records({1, 2});
  b.pop_back();
  write_file(dir / "data_batch_3.bin", b);
  expect_user_error([&] { load_cifar10(dir.path().string()); },
                    {"cifar10: ", dir / "data_batch_3.bin", "holds 6145 bytes",
                     "not a whole number of 3073-byte records"});
  write_file(dir / "data_batch_3.bin", Bytes{});
  expect_user_error([&] { load_cifar10(dir.path().string()); }, {dir / "data_batch_3.bin", " is empty"});
}

TEST(LoadCifar10, LabelOutOfRange) {
  ScratchDir dir;
  write_batches(dir);
  write_file(dir / "test_batch.bin", cifar_records({1, 2, 10}));
  expect_user_error([&] { load_cifar10(dir.path().string()); },
                    {"cifar10: ", dir / "test_batch.bin", "record 2 has label 10", "expected 0..9"});
}

TEST(LoadCifar10, MissingFilesAreListed) {
  ScratchDir dir;
  write_batches(dir);
  std::filesystem::remove(dir / "data_batch_4.bin");
  std::filesystem::remove(dir / "test_batch.bin");
  expect_user_error([&] { load_cifar10(dir.path().string()); },
                    {"cifar10: ", dir.path().string(), "lacks data_batch_4.bin, test_batch.bin",
                     "expected data_batch_1.bin .. data_batch_5.bin and test_batch.bin"});
}

TEST(LoadCifar10, PointsIntoTheArchiveFolder) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "cifar-10-batches-bin");
  for (int b = 0; b <= 5; ++b)
    write_file(dir / ("cifar-10-batches-bin/" + batch_name(b)), cifar_records(kLabels[b], b));
  expect_user_error([&] { load_cifar10(dir.path().string()); },
                    {"holds none of the CIFAR-10 binary files",
                     "did you mean cifar10:" + (dir / "cifar-10-batches-bin") + "?"});
  const TrainTest tt = load_cifar10(dir / "cifar-10-batches-bin");
  expect_batches(tt.train, {1, 2, 3, 4, 5});
}

TEST(LoadCifar10, MissingOrNotADirectory) {
  ScratchDir dir;
  expect_user_error([&] { load_cifar10(dir / "absent"); },
                    {"cifar10: ", dir / "absent", "does not exist", "data_batch_1.bin"});
  write_file(dir / "file", Bytes{1});
  expect_user_error([&] { load_cifar10(dir / "file"); }, {"cifar10: ", dir / "file", "not a directory"});
  std::filesystem::create_directory(dir / "empty");
  expect_user_error([&] { load_cifar10(dir / "empty"); },
                    {"cifar10: ", dir / "empty", "holds none of the CIFAR-10 binary files",
                     "expected data_batch_1.bin .. data_batch_5.bin and test_batch.bin"});
}

}  // namespace
}  // namespace fanout::data
