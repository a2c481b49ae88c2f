// Helpers for the data-reader tests: temp directories, IDX / CIFAR-10 file
// writers (raw and gzip'd), and a check for one-line user errors.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace fanout::testing {

using Bytes = std::vector<uint8_t>;

// A fresh directory under ::testing::TempDir(), removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void write_file(const std::string& path, const Bytes& bytes);
void write_gz(const std::string& path, const Bytes& bytes);  // zlib gzopen("wb")

// IDX files: big-endian magic, dims, then the bytes.
Bytes idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& data);
Bytes idx_images(uint32_t n, uint32_t h, uint32_t w, const Bytes& pixels);  // magic 0x00000803
Bytes idx_labels(const Bytes& labels);                                       // magic 0x00000801
// n images of h x w whose pixel k of image i is (7 * i + k) % 256: every byte checkable.
Bytes pattern_pixels(uint32_t n, uint32_t h, uint32_t w);

// CIFAR-10 records: per record, label byte + 3072 image bytes, image bytes (label + 3 * k + r) % 256.
Bytes cifar_records(const std::vector<uint8_t>& labels, int salt = 0);
uint8_t cifar_pixel(uint8_t label, int salt, int64_t record, int64_t k);

}  // namespace fanout::testing
