// Helpers for the data-reader tests (see data_test_util.h).
#include "data/data_test_util.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "runtime/core/error.h"

namespace fanout::testing {

ScratchDir::ScratchDir() {
  std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "fanout-data-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const Bytes& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  const size_t n = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (n != bytes.size()) throw std::runtime_error("short write to " + path);
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile g = gzopen(path.c_str(), "wb");
  if (!g) throw std::runtime_error("cannot gzopen " + path);
  const int n = bytes.empty() ? 0 : gzwrite(g, bytes.data(), static_cast<unsigned>(bytes.size()));
  if (gzclose(g) != Z_OK || n != static_cast<int>(bytes.size())) throw std::runtime_error("gzwrite failed for " + path);
}

static void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

Bytes idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes b;
  put_be32(b, magic);
  for (uint32_t d : dims) put_be32(b, d);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes idx_images(uint32_t n, uint32_t h, uint32_t w, const Bytes& pixels) {
  return idx_bytes(0x00000803, {n, h, w}, pixels);
}

Bytes idx_labels(const Bytes& labels) {
  return idx_bytes(0x00000801, {static_cast<uint32_t>(labels.size())}, labels);
}

Bytes pattern_pixels(uint32_t n, uint32_t h, uint32_t w) {
  Bytes p(static_cast<size_t>(n) * h * w);
  for (size_t i = 0; i < n; ++i)
    for (size_t k = 0; k < static_cast<size_t>(h) * w; ++k) p[i * h * w + k] = static_cast<uint8_t>((7 * i + k) % 256);
  return p;
}

uint8_t cifar_pixel(uint8_t label, int salt, int64_t record, int64_t k) {
  return static_cast<uint8_t>((label + 3 * k + 11 * record + salt) % 256);
}

Bytes cifar_records(const std::vector<uint8_t>& labels, int salt) {
  Bytes b;
  for (size_t r = 0; r < labels.size(); ++r) {
    b.push_back(labels[r]);
    for (int64_t k = 0; k < 3072; ++k) b.push_back(cifar_pixel(labels[r], salt, static_cast<int64_t>(r), k));
  }
  return b;
}

}  // namespace fanout::testing
