// CIFAR-10 binary-version reader: data_batch_1..5.bin (train) and test_batch.bin (test).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace fanout::data {

namespace {

constexpr int kNumClasses = 10;
constexpr int64_t kC = 3, kH = 32, kW = 32;
constexpr int64_t kImageBytes = kC * kH * kW;     // 3072, CHW
constexpr int64_t kRecordBytes = 1 + kImageBytes;  // label byte + image

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

// Number of records in a batch file; throws when its size is not a whole number of records.
int64_t count_records(const std::string& path) {
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  FANOUT_USER_CHECK(!ec) << "cifar10: cannot read the size of " << path << ": " << ec.message();
  FANOUT_USER_CHECK(bytes > 0) << "cifar10: " << path << " is empty (a batch file holds 3073-byte records)";
  FANOUT_USER_CHECK(bytes % kRecordBytes == 0)
      << "cifar10: " << path << " holds " << bytes << " bytes, not a whole number of " << kRecordBytes
      << "-byte records (1 label byte + 3x32x32 image bytes)";
  return static_cast<int64_t>(bytes / kRecordBytes);
}

// Reads `n` records of `path` into images (n, 3, 32, 32) and labels (n) at the given pointers.
void read_records(const std::string& path, int64_t n, uint8_t* images, int32_t* labels) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  FANOUT_USER_CHECK(f != nullptr) << "cifar10: cannot open " << path << ": " << std::strerror(errno);
  const int64_t per_chunk = 1024;  // records per read
  std::vector<uint8_t> buf(static_cast<size_t>(per_chunk * kRecordBytes));
  for (int64_t first = 0; first < n; first += per_chunk) {
    const int64_t k = std::min(per_chunk, n - first);
    const size_t want = static_cast<size_t>(k * kRecordBytes);
    const size_t got = std::fread(buf.data(), 1, want, f.get());
    FANOUT_USER_CHECK(!std::ferror(f.get())) << "cifar10: cannot read " << path << ": " << std::strerror(errno);
    FANOUT_USER_CHECK(got == want) << "cifar10: " << path << " ended early (it shrank while being read?)";
    for (int64_t r = 0; r < k; ++r) {
      const uint8_t* rec = buf.data() + r * kRecordBytes;
      FANOUT_USER_CHECK(rec[0] < kNumClasses) << "cifar10: " << path << " record " << first + r << " has label "
                                              << int{rec[0]} << " (expected 0.." << kNumClasses - 1 << ")";
      labels[first + r] = rec[0];
      std::memcpy(images + (first + r) * kImageBytes, rec + 1, kImageBytes);
    }
  }
}

// Concatenates the records of `paths` into one dataset.
ImageDataset read_split(const std::vector<std::string>& paths, const std::string& name) {
  std::vector<int64_t> counts;
  int64_t n = 0;
  for (const std::string& p : paths) n += counts.emplace_back(count_records(p));
  ImageDataset ds;
  ds.name = name;
  ds.num_classes = kNumClasses;
  ds.images = Tensor::empty(Shape{n, kC, kH, kW}, DType::U8);  // (N, 3, 32, 32)
  ds.labels = Tensor::empty(Shape{n}, DType::I32);              // (N)
  int64_t at = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    read_records(paths[i], counts[i], ds.images.data<uint8_t>() + at * kImageBytes, ds.labels.data<int32_t>() + at);
    at += counts[i];
  }
  // The standard CIFAR-10 constants (train-set per-channel mean and std), for both splits.
  ds.mean = {0.4914f, 0.4822f, 0.4465f};
  ds.std = {0.2470f, 0.2435f, 0.2616f};
  return ds;
}

}  // namespace

TrainTest load_cifar10(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string expected = "data_batch_1.bin .. data_batch_5.bin and test_batch.bin";
  FANOUT_USER_CHECK(fs::exists(dir, ec)) << "cifar10: directory " << dir << " does not exist (looked for "
                                         << expected << " in it)";
  FANOUT_USER_CHECK(fs::is_directory(dir, ec)) << "cifar10: " << dir << " is not a directory";

  std::vector<std::string> train, test{(fs::path(dir) / "test_batch.bin").string()};
  for (int i = 1; i <= 5; ++i) train.push_back((fs::path(dir) / ("data_batch_" + std::to_string(i) + ".bin")).string());
  std::string missing;
  int n_missing = 0;
  for (const auto* list : {&train, &test})
    for (const std::string& p : *list)
      if (!fs::is_regular_file(p, ec)) missing += (n_missing++ ? ", " : "") + fs::path(p).filename().string();
  if (n_missing > 0) {
    // The official archive unpacks into cifar-10-batches-bin/: point there when that is the mistake.
    const fs::path sub = fs::path(dir) / "cifar-10-batches-bin";
    const std::string hint =
        fs::is_regular_file(sub / "test_batch.bin", ec) ? "; did you mean cifar10:" + sub.string() + "?" : "";
    FANOUT_USER_CHECK(n_missing < 6) << "cifar10: " << dir << " holds none of the CIFAR-10 binary files (expected "
                                     << expected << ")" << hint;
    FANOUT_FAIL() << "cifar10: " << dir << " lacks " << missing << " (expected " << expected << ")" << hint;
  }
  TrainTest tt;
  tt.train = read_split(train, "cifar10/train");
  tt.test = read_split(test, "cifar10/test");
  return tt;
}

}  // namespace fanout::data
