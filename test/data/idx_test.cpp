// read_idx and load_fashion_mnist on small IDX files written here: raw and
// gzip'd round trips, and every kind of bad file giving a one-line error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "data/data_test_util.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace fanout::data {
namespace {

using namespace fanout::testing;  // the data tests' file builders and checks

constexpr uint32_t kN = 5, kH = 3, kW = 4;
const Bytes kLabels = {3, 0, 9, 1, 7};

void expect_matches(const ImageDataset& ds, const Bytes& pixels, const Bytes& labels) {
  ASSERT_EQ(ds.images.shape(), (Shape{static_cast<int64_t>(labels.size()), 1, kH, kW}));
  ASSERT_EQ(ds.images.dtype(), DType::U8);
  ASSERT_EQ(ds.labels.shape(), (Shape{static_cast<int64_t>(labels.size())}));
  ASSERT_EQ(ds.labels.dtype(), DType::I32);
  EXPECT_EQ(ds.size(), static_cast<int64_t>(labels.size()));
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_EQ(ds.sample_shape(), (Shape{1, kH, kW}));
  for (size_t k = 0; k < pixels.size(); ++k) ASSERT_EQ(ds.images.data<uint8_t>()[k], pixels[k]) << "pixel " << k;
  for (size_t i = 0; i < labels.size(); ++i) EXPECT_EQ(ds.labels.data<int32_t>()[i], labels[i]) << "label " << i;
}

// Population mean and std of the bytes on the [0, 1] scale.
void byte_stats(const Bytes& b, double& mean, double& std) {
  double s = 0, s2 = 0;
  for (uint8_t v : b) s += v / 255.0;
  mean = s / b.size();
  for (uint8_t v : b) s2 += (v / 255.0 - mean) * (v / 255.0 - mean);
  std = std::sqrt(s2 / b.size());
}

TEST(ReadIdx, RawRoundTrip) {
  ScratchDir dir;
  const Bytes px = pattern_pixels(kN, kH, kW);
  write_file(dir / "img", idx_images(kN, kH, kW, px));
  write_file(dir / "lbl", idx_labels(kLabels));
  const ImageDataset ds = read_idx(dir / "img", dir / "lbl", "tiny/train");
  expect_matches(ds, px, kLabels);
  EXPECT_EQ(ds.name, "tiny/train");
  // A generic IDX file: mean and std come from its own pixels.
  double mean, std;
  byte_stats(px, mean, std);
  ASSERT_EQ(ds.mean.size(), 1u);
  ASSERT_EQ(ds.std.size(), 1u);
  EXPECT_NEAR(ds.mean[0], mean, 1e-6);
  EXPECT_NEAR(ds.std[0], std, 1e-6);
}

// gzip is told by content, not by name: each file of a pair compressed or
// not, under a name that says so or says the opposite.
TEST(ReadIdx, GzipDetectedByContentNotName) {
  struct Case {
    const char *images, *labels;
    bool images_gz, labels_gz;
  };
  const Case cases[] = {{"img.gz", "lbl.gz", true, true},
                        {"img.gz", "lbl", true, false},
                        {"images-no-suffix", "labels-raw.gz", true, false},
                        {"images-raw.gz", "labels-no-suffix", false, true}};
  const Bytes px = pattern_pixels(kN, kH, kW);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.images) + " " + c.labels);
    ScratchDir dir;
    (c.images_gz ? write_gz : write_file)(dir / c.images, idx_images(kN, kH, kW, px));
    (c.labels_gz ? write_gz : write_file)(dir / c.labels, idx_labels(kLabels));
    expect_matches(read_idx(dir / c.images, dir / c.labels, "t"), px, kLabels);
  }
}

TEST(ReadIdx, LargerGzipFileReadsAcrossChunks) {
  // > 1 MiB uncompressed so the reader loops over several reads.
  ScratchDir dir;
  const uint32_t n = 1500, h = 28, w = 28;
  const Bytes px = pattern_pixels(n, h, w);
  Bytes labels(n);
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  write_gz(dir / "img", idx_images(n, h, w, px));
  write_file(dir / "lbl", idx_labels(labels));
  const ImageDataset ds = read_idx(dir / "img", dir / "lbl", "t");
  ASSERT_EQ(ds.images.shape(), (Shape{n, 1, h, w}));
  EXPECT_EQ(std::memcmp(ds.images.raw(), px.data(), px.size()), 0);
  EXPECT_EQ(ds.labels.data<int32_t>()[1499], 9);
}

TEST(ReadIdx, TruncatedImageData) {
  ScratchDir dir;
  Bytes px = pattern_pixels(kN, kH, kW);
  px.resize(50);  // 60 promised
  write_file(dir / "img", idx_images(kN, kH, kW, px));
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "img", "is truncated", "header says 5 images of 3x4", "holds 50 bytes of data"});
  // The same through gzip.
  write_gz(dir / "img.gz", idx_images(kN, kH, kW, px));
  expect_user_error([&] { read_idx(dir / "img.gz", dir / "lbl", "t"); },
                    {dir / "img.gz", "is truncated", "header says 5 images of 3x4", "holds 50 bytes of data"});
}

TEST(ReadIdx, TruncatedLabelData) {
  ScratchDir dir;
  write_file(dir / "img", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  Bytes lbl = idx_labels(kLabels);
  lbl.pop_back();
  write_file(dir / "lbl", lbl);
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "lbl", "is truncated", "header says 5 labels", "holds 4 bytes of data"});
}

TEST(ReadIdx, TruncatedGzipStream) {
  ScratchDir dir;
  write_gz(dir / "img.gz", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  write_file(dir / "lbl", idx_labels(kLabels));
  // Cut the compressed stream itself (drop the trailer and some deflate data).
  const auto size = std::filesystem::file_size(dir / "img.gz");
  std::filesystem::resize_file(dir / "img.gz", size - 12);
  const std::string msg =
      expect_user_error([&] { read_idx(dir / "img.gz", dir / "lbl", "t"); }, {dir / "img.gz", "truncated"});
  EXPECT_EQ(msg.find(dir / "img.gz"), msg.rfind(dir / "img.gz")) << "path named twice: " << msg;
}

TEST(ReadIdx, CorruptGzipStream) {
  ScratchDir dir;
  write_gz(dir / "img.gz", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  write_file(dir / "lbl", idx_labels(kLabels));
  // Flip a byte of the CRC in the gzip trailer: the data inflates but fails its check.
  const auto size = std::filesystem::file_size(dir / "img.gz");
  FILE* f = std::fopen((dir / "img.gz").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(size) - 8, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(size) - 8, SEEK_SET);
  std::fputc(c ^ 0xff, f);
  std::fclose(f);
  expect_user_error([&] { read_idx(dir / "img.gz", dir / "lbl", "t"); }, {dir / "img.gz", "corrupt"});
}

TEST(ReadIdx, TruncatedHeader) {
  ScratchDir dir;
  write_file(dir / "lbl", idx_labels(kLabels));
  // Magic and one of three dims.
  write_file(dir / "img", Bytes{0x00, 0x00, 0x08, 0x03, 0x00, 0x00, 0x00, 0x05});
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "img", "is truncated", "header needs 16 bytes", "holds 8"});
  // Not even a magic number; and an empty file.
  write_file(dir / "img", Bytes{0x00, 0x00});
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {dir / "img", "is truncated", "holds 2 bytes"});
  write_file(dir / "img", Bytes{});
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {dir / "img", "is truncated", "holds 0 bytes"});
  // Truncated header inside a gzip'd file.
  write_gz(dir / "img", Bytes{0x00, 0x00, 0x08, 0x03, 0x00, 0x00});
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {dir / "img", "header needs 16 bytes"});
}

TEST(ReadIdx, BadMagic) {
  ScratchDir dir;
  write_file(dir / "img", idx_bytes(0x00000804, {kN, kH, kW}, pattern_pixels(kN, kH, kW)));
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {"bad IDX magic 0x00000804", dir / "img", "expected 0x00000803 for images"});
  // Some other file entirely.
  write_file(dir / "img", Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '\n'});
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {"bad IDX magic 0x68656c6c", dir / "img"});
}

TEST(ReadIdx, SwappedFilesAreNamed) {
  ScratchDir dir;
  write_file(dir / "img", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir / "lbl", dir / "img", "t"); },
                    {"bad IDX magic 0x00000801", dir / "lbl", "expected 0x00000803 for images",
                     "is an IDX label file"});
}

TEST(ReadIdx, CountMismatch) {
  ScratchDir dir;
  write_file(dir / "img", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  write_file(dir / "lbl", idx_labels({1, 2, 3, 4}));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "img", "holds 5 images", dir / "lbl", "holds 4 labels"});
}

TEST(ReadIdx, LabelOutOfRange) {
  ScratchDir dir;
  write_file(dir / "img", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  write_gz(dir / "lbl", idx_labels({1, 2, 10, 4, 5}));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "lbl", "label 10 at index 2", "expected 0..9"});
}

TEST(ReadIdx, MissingFile) {
  ScratchDir dir;
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir / "nope", dir / "lbl", "t"); },
                    {"cannot open", dir / "nope", "No such file or directory"});
  write_file(dir / "img", idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW)));
  expect_user_error([&] { read_idx(dir / "img", dir / "nolabels", "t"); }, {"cannot open", dir / "nolabels"});
}

TEST(ReadIdx, DirectoryInsteadOfFile) {
  ScratchDir dir;
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir.path().string(), dir / "lbl", "t"); }, {dir.path().string(), "is a directory"});
}

TEST(ReadIdx, AbsurdDimsAreTruncationNotAllocation) {
  ScratchDir dir;
  write_file(dir / "lbl", idx_labels(kLabels));
  // 2^32-1 cubed overflows 64 bits; the claim is capped against what the file holds.
  write_file(dir / "img", idx_bytes(0x00000803, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, Bytes(100, 1)));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "img", "is truncated", "header says 4294967295 images of 4294967295x4294967295",
                     "holds 100 bytes of data"});
  write_gz(dir / "img", idx_bytes(0x00000803, {1000000000, 28, 28}, Bytes(100, 1)));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {"is truncated", "header says 1000000000 images of 28x28"});
}

TEST(ReadIdx, EmptyCountsAndSizes) {
  ScratchDir dir;
  write_file(dir / "lbl", idx_labels(kLabels));
  write_file(dir / "img", idx_images(0, kH, kW, {}));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {dir / "img", "header says 0 images"});
  write_file(dir / "img", idx_images(kN, 0, kW, {}));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); }, {dir / "img", "images of 0x4"});
}

TEST(ReadIdx, TrailingData) {
  ScratchDir dir;
  Bytes img = idx_images(kN, kH, kW, pattern_pixels(kN, kH, kW));
  img.push_back(0);
  write_file(dir / "img", img);
  write_file(dir / "lbl", idx_labels(kLabels));
  expect_user_error([&] { read_idx(dir / "img", dir / "lbl", "t"); },
                    {dir / "img", "more data than its header says", "5 images of 3x4"});
}

// Writes the four Fashion-MNIST files (tiny) into dir; `gz` picks which are gzip'd and suffixed.
struct TinyFashion {
  Bytes train_px = pattern_pixels(6, kH, kW), test_px = pattern_pixels(4, kH, kW);
  Bytes train_lb = {0, 1, 2, 3, 4, 9}, test_lb = {5, 6, 7, 8};
  void write(const ScratchDir& dir, const bool gz[4]) const {
    const std::string names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                  "t10k-labels-idx1-ubyte"};
    const Bytes content[4] = {idx_images(6, kH, kW, train_px), idx_labels(train_lb), idx_images(4, kH, kW, test_px),
                              idx_labels(test_lb)};
    for (int i = 0; i < 4; ++i) {
      if (gz[i]) write_gz(dir / (names[i] + ".gz"), content[i]);
      else write_file(dir / names[i], content[i]);
    }
  }
};

void expect_tiny_fashion(const TrainTest& tt, const TinyFashion& f) {
  expect_matches(tt.train, f.train_px, f.train_lb);
  expect_matches(tt.test, f.test_px, f.test_lb);
  EXPECT_EQ(tt.train.name, "fashion-mnist/train");
  EXPECT_EQ(tt.test.name, "fashion-mnist/test");
  for (const ImageDataset* ds : {&tt.train, &tt.test}) {
    // The standard Fashion-MNIST constants, not the tiny files' statistics.
    ASSERT_EQ(ds->mean.size(), 1u);
    EXPECT_FLOAT_EQ(ds->mean[0], 0.2860f);
    EXPECT_FLOAT_EQ(ds->std[0], 0.3530f);
  }
}

TEST(LoadFashionMnist, RawGzipAndMixed) {
  const TinyFashion f;
  const bool patterns[3][4] = {{false, false, false, false}, {true, true, true, true}, {true, false, false, true}};
  for (const auto& gz : patterns) {
    ScratchDir dir;
    f.write(dir, gz);
    SCOPED_TRACE(::testing::Message() << "gz " << gz[0] << gz[1] << gz[2] << gz[3]);
    expect_tiny_fashion(load_fashion_mnist(dir.path().string()), f);
  }
}

TEST(LoadFashionMnist, MissingDirectory) {
  ScratchDir dir;
  const std::string missing = dir / "not-here";
  expect_user_error([&] { load_fashion_mnist(missing); },
                    {"fashion-mnist", missing, "does not exist", "train-images-idx3-ubyte[.gz]",
                     "train-labels-idx1-ubyte[.gz]", "t10k-images-idx3-ubyte[.gz]", "t10k-labels-idx1-ubyte[.gz]"});
}

TEST(LoadFashionMnist, NotADirectory) {
  ScratchDir dir;
  write_file(dir / "file", Bytes{1});
  expect_user_error([&] { load_fashion_mnist(dir / "file"); }, {"fashion-mnist", dir / "file", "not a directory"});
}

TEST(LoadFashionMnist, EmptyDirectory) {
  ScratchDir dir;
  expect_user_error([&] { load_fashion_mnist(dir.path().string()); },
                    {"fashion-mnist", dir.path().string(), "holds none of the Fashion-MNIST files",
                     "looked for train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], "
                     "t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]"});
}

TEST(LoadFashionMnist, MissingFilesAreListed) {
  ScratchDir dir;
  const bool gz[4] = {true, true, true, true};
  TinyFashion().write(dir, gz);
  std::filesystem::remove(dir / "t10k-labels-idx1-ubyte.gz");
  std::filesystem::remove(dir / "train-images-idx3-ubyte.gz");
  const std::string msg = expect_user_error([&] { load_fashion_mnist(dir.path().string()); },
                                            {"fashion-mnist", dir.path().string(),
                                             "lacks train-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]",
                                             "looked for"});
  EXPECT_EQ(msg.find("lacks train-labels"), std::string::npos) << msg;
}

TEST(LoadFashionMnist, ReaderErrorsNameTheDataset) {
  ScratchDir dir;
  const bool gz[4] = {false, false, false, false};
  TinyFashion().write(dir, gz);
  write_file(dir / "t10k-labels-idx1-ubyte", idx_labels({5, 6, 77, 8}));
  expect_user_error([&] { load_fashion_mnist(dir.path().string()); },
                    {"fashion-mnist: ", dir / "t10k-labels-idx1-ubyte", "label 77 at index 2"});
}

TEST(LoadFashionMnist, DefaultDirectory) {
  EXPECT_EQ(default_fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
}

}  // namespace
}  // namespace fanout::data
