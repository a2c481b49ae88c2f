// IDX reader (MNIST / Fashion-MNIST format), gzip'd or raw, and the Fashion-MNIST loader.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace fanout::data {

namespace detail {
// Per-channel mean and std of uint8 images (N, C, H, W) on the [0, 1] scale (dataset.cpp).
void channel_mean_std(const Tensor& images, std::vector<float>& mean, std::vector<float>& std);
}  // namespace detail

namespace {

constexpr uint32_t kImageMagic = 0x00000803;  // unsigned byte, 3 dims (N, H, W)
constexpr uint32_t kLabelMagic = 0x00000801;  // unsigned byte, 1 dim (N)
constexpr int kNumClasses = 10;
constexpr size_t kChunk = size_t{1} << 20;

std::string hex32(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

// A file read sequentially, through zlib when it starts with the gzip magic
// (1f 8b) and through stdio otherwise. Errors name `who` and the path.
class ByteReader {
 public:
  ByteReader(const std::string& path, const std::string& who) : path_(path), who_(who) {
    std::error_code ec;
    FANOUT_USER_CHECK(!std::filesystem::is_directory(path, ec))
        << who_ << ": " << path_ << " is a directory, not an IDX file";
    file_ = std::fopen(path.c_str(), "rb");
    FANOUT_USER_CHECK(file_ != nullptr) << who_ << ": cannot open " << path_ << ": " << std::strerror(errno);
    unsigned char m[2] = {0, 0};
    const size_t got = std::fread(m, 1, 2, file_);
    if (std::ferror(file_)) {
      const int e = errno;
      std::fclose(file_);
      FANOUT_FAIL() << who_ << ": cannot read " << path_ << ": " << std::strerror(e);
    }
    if (got == 2 && m[0] == 0x1f && m[1] == 0x8b) {  // gzip magic
      std::fclose(file_);
      file_ = nullptr;
      gz_ = gzopen(path.c_str(), "rb");
      FANOUT_USER_CHECK(gz_ != nullptr) << who_ << ": cannot open " << path_ << ": " << std::strerror(errno);
      gzbuffer(gz_, 1 << 17);
    } else {
      std::rewind(file_);
    }
  }
  ~ByteReader() {
    if (file_) std::fclose(file_);
    if (gz_) gzclose_r(gz_);
  }
  ByteReader(const ByteReader&) = delete;
  ByteReader& operator=(const ByteReader&) = delete;

  bool gzipped() const { return gz_ != nullptr; }

  // Reads up to n bytes into dst; fewer only at the end of the data.
  size_t read(void* dst, size_t n) {
    auto* p = static_cast<unsigned char*>(dst);
    size_t total = 0;
    while (total < n) {
      const size_t want = std::min(n - total, kChunk);
      size_t got = 0;
      if (gz_) {
        const int r = gzread(gz_, p + total, static_cast<unsigned>(want));
        check_gz();
        FANOUT_USER_CHECK(r >= 0) << who_ << ": cannot read " << path_ << ": corrupt gzip data";
        got = static_cast<size_t>(r);
      } else {
        got = std::fread(p + total, 1, want, file_);
        FANOUT_USER_CHECK(!std::ferror(file_))
            << who_ << ": cannot read " << path_ << ": " << std::strerror(errno);
      }
      total += got;
      if (got < want) break;
    }
    return total;
  }

  // Reads to the end of the data, but no more than `cap` bytes.
  std::vector<uint8_t> read_rest(uint64_t cap) {
    std::vector<uint8_t> out;
    while (out.size() < cap) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(cap - out.size(), kChunk));
      const size_t old = out.size();
      out.resize(old + want);
      const size_t got = read(out.data() + old, want);
      out.resize(old + got);
      if (got < want) break;
    }
    return out;
  }

 private:
  void check_gz() {
    int err = Z_OK;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_OK || err == Z_STREAM_END) return;
    // Z_BUF_ERROR here means the gzip stream ended early ("unexpected end of file").
    // zlib prefixes its message with the path, which ours already names.
    std::string m = msg ? msg : "?";
    if (m.rfind(path_ + ": ", 0) == 0) m = m.substr(path_.size() + 2);
    FANOUT_FAIL() << who_ << ": " << path_ << " is a corrupt or truncated gzip file (zlib: " << m << ")";
  }

  std::string path_, who_;
  FILE* file_ = nullptr;
  gzFile gz_ = nullptr;
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Multiplies with saturation at UINT64_MAX: a header's claimed size can be
// absurd; it is only ever compared with what the file holds.
uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> data;
};

// Reads one IDX file of unsigned bytes with `want_magic` (which fixes the
// number of dims), validating the header against the data it holds.
IdxFile read_idx_file(const std::string& path, uint32_t want_magic, const std::string& who) {
  const bool images = want_magic == kImageMagic;
  const char* what = images ? "images" : "labels";
  ByteReader in(path, who);
  const int ndims = static_cast<int>(want_magic & 0xff);
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(ndims);
  uint8_t header[16] = {};
  const size_t got = in.read(header, 4);
  FANOUT_USER_CHECK(got == 4) << who << ": " << path << " is truncated: it holds " << got
                              << " bytes, too few for an IDX header";
  const uint32_t magic = be32(header);
  if (magic != want_magic) {
    std::ostringstream hint;
    if (magic == kImageMagic) hint << "; " << hex32(magic) << " is an IDX image file";
    if (magic == kLabelMagic) hint << "; " << hex32(magic) << " is an IDX label file";
    FANOUT_FAIL() << who << ": bad IDX magic " << hex32(magic) << " in " << path << " (expected " << hex32(want_magic)
                  << " for " << what << hint.str() << ")";
  }
  const size_t got_dims = in.read(header + 4, header_bytes - 4);
  FANOUT_USER_CHECK(got_dims == header_bytes - 4)
      << who << ": " << path << " is truncated: its IDX header needs " << header_bytes << " bytes but the file holds "
      << 4 + got_dims;

  IdxFile f;
  uint64_t claimed = 1;
  for (int i = 0; i < ndims; ++i) {
    f.dims.push_back(be32(header + 4 + 4 * i));
    claimed = sat_mul(claimed, f.dims.back());
  }
  FANOUT_USER_CHECK(f.dims[0] > 0) << who << ": " << path << " header says 0 " << what;
  std::ostringstream says;  // "60000 images of 28x28"
  says << f.dims[0] << " " << what;
  if (images) {
    FANOUT_USER_CHECK(f.dims[1] > 0 && f.dims[2] > 0)
        << who << ": " << path << " header says images of " << f.dims[1] << "x" << f.dims[2] << " (empty)";
    says << " of " << f.dims[1] << "x" << f.dims[2];
  }
  // Reads one byte more than claimed to notice trailing data; never more than the file holds.
  f.data = in.read_rest(claimed == UINT64_MAX ? claimed : claimed + 1);
  FANOUT_USER_CHECK(f.data.size() >= claimed) << who << ": " << path << " is truncated: header says " << says.str()
                                              << " but the file holds " << f.data.size() << " bytes of data";
  FANOUT_USER_CHECK(f.data.size() == claimed)
      << who << ": " << path << " holds more data than its header says (" << says.str() << ", " << claimed
      << " bytes); is it the right file?";
  return f;
}

// Where a Fashion-MNIST file lives in dir: the raw name or the .gz one; empty if neither.
std::string find_idx(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

ImageDataset read_idx_as(const std::string& images_path, const std::string& labels_path, const std::string& name,
                         const std::string& who) {
  IdxFile im = read_idx_file(images_path, kImageMagic, who);
  IdxFile lb = read_idx_file(labels_path, kLabelMagic, who);
  FANOUT_USER_CHECK(im.dims[0] == lb.dims[0])
      << who << ": " << images_path << " holds " << im.dims[0] << " images but " << labels_path << " holds "
      << lb.dims[0] << " labels";
  const int64_t n = im.dims[0], h = im.dims[1], w = im.dims[2];

  ImageDataset ds;
  ds.name = name;
  ds.num_classes = kNumClasses;
  ds.labels = Tensor::empty(Shape{n}, DType::I32);  // (N)
  int32_t* y = ds.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    FANOUT_USER_CHECK(lb.data[i] < kNumClasses)
        << who << ": " << labels_path << " has label " << int{lb.data[i]} << " at index " << i << " (expected 0.."
        << kNumClasses - 1 << ")";
    y[i] = lb.data[i];
  }
  lb.data = {};
  ds.images = Tensor::empty(Shape{n, 1, h, w}, DType::U8);  // (N, 1, H, W)
  std::memcpy(ds.images.raw(), im.data.data(), im.data.size());
  return ds;
}

constexpr const char* kFashionFiles[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

std::string fashion_file_list() {
  std::string s;
  for (const char* f : kFashionFiles) s += std::string(s.empty() ? "" : ", ") + f + "[.gz]";
  return s;
}

}  // namespace

// mean/std: computed from this file's pixels (one channel), since a generic
// IDX file has no known constants. load_fashion_mnist replaces them with the
// standard Fashion-MNIST constants, the same for both splits.
ImageDataset read_idx(const std::string& images_path, const std::string& labels_path, const std::string& name) {
  ImageDataset ds = read_idx_as(images_path, labels_path, name, name);
  detail::channel_mean_std(ds.images, ds.mean, ds.std);
  return ds;
}

std::string default_fashion_mnist_dir() { return "/usr/share/datasets/fashion-mnist"; }

TrainTest load_fashion_mnist(const std::string& dir) {
  const std::string who = "fashion-mnist";
  std::error_code ec;
  FANOUT_USER_CHECK(std::filesystem::exists(dir, ec))
      << who << ": directory " << dir << " does not exist (looked for " << fashion_file_list() << " in it"
      << (dir == default_fashion_mnist_dir() ? "; install the Debian package dataset-fashion-mnist" : "") << ")";
  FANOUT_USER_CHECK(std::filesystem::is_directory(dir, ec)) << who << ": " << dir << " is not a directory";
  std::string paths[4], missing;
  int n_missing = 0;
  for (int i = 0; i < 4; ++i) {
    paths[i] = find_idx(dir, kFashionFiles[i]);
    if (paths[i].empty()) missing += std::string(n_missing++ ? ", " : "") + kFashionFiles[i] + "[.gz]";
  }
  FANOUT_USER_CHECK(n_missing < 4) << who << ": " << dir << " holds none of the Fashion-MNIST files (looked for "
                                   << fashion_file_list() << ")";
  FANOUT_USER_CHECK(n_missing == 0) << who << ": " << dir << " lacks " << missing << " (looked for "
                                    << fashion_file_list() << ")";
  TrainTest tt;
  tt.train = read_idx_as(paths[0], paths[1], "fashion-mnist/train", who);
  tt.test = read_idx_as(paths[2], paths[3], "fashion-mnist/test", who);
  // Fashion-MNIST's normalization constants (its train split's pixel mean and std), whatever DIR holds.
  for (ImageDataset* ds : {&tt.train, &tt.test}) {
    ds->mean = {0.2860f};
    ds->std = {0.3530f};
  }
  return tt;
}

}  // namespace fanout::data
