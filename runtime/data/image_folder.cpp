// Image folders: the file list, and each sample read, decoded and transformed on a loader worker.
#include "runtime/data/image_folder.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "runtime/core/error.h"
#include "runtime/data/image_codec.h"
#include "runtime/data/image_transforms.h"
#include "runtime/data/sampler.h"

namespace fanout::data {

namespace fs = std::filesystem;

void parse_normalize(const std::string& spec, std::vector<float>& mean, std::vector<float>& std) {
  if (spec == "imagenet") {
    mean = {0.485f, 0.456f, 0.406f};
    std = {0.229f, 0.224f, 0.225f};
    return;
  }
  mean.clear();
  std.clear();
  if (spec == "none") return;
  std::vector<float> v;
  size_t begin = 0;
  while (true) {
    const size_t comma = spec.find(',', begin);
    const std::string part = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    float x = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), x);
    FANOUT_USER_CHECK(!part.empty() && ec == std::errc() && end == part.data() + part.size() && std::isfinite(x))
        << "bad --normalize '" << spec << "': expected imagenet, none, M,S or M1,M2,M3,S1,S2,S3";
    v.push_back(x);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  FANOUT_USER_CHECK(v.size() == 2 || v.size() == 6)
      << "bad --normalize '" << spec << "': " << v.size() << " numbers (expected M,S or M1,M2,M3,S1,S2,S3)";
  const size_t k = v.size() / 2;
  for (size_t c = 0; c < 3; ++c) {
    mean.push_back(v[k == 1 ? 0 : c]);
    std.push_back(v[k == 1 ? 1 : 3 + c]);
    FANOUT_USER_CHECK(std.back() > 0) << "bad --normalize '" << spec << "': a std must be positive";
  }
}

Augment eval_pipeline(const Augment& train) {
  Augment e;
  if (train.resized_crop > 0) {
    e.resize = static_cast<int>(static_cast<int64_t>(train.resized_crop) * 256 / 224);
    e.center_crop = train.resized_crop;
  } else {
    e.resize = train.resize;
    e.center_crop = train.center_crop;
  }
  e.jpeg_draft = train.jpeg_draft;
  return e;
}

ImageFileDataset::ImageFileDataset(std::vector<File> files, std::vector<std::string> classes, Augment pipeline,
                                   std::vector<float> mean, std::vector<float> std, std::string n, bool skip_bad)
    : files_(std::move(files)), classes_(std::move(classes)), pipeline_(pipeline), mean_(std::move(mean)),
      std_(std::move(std)), skip_bad_(skip_bad) {
  name = std::move(n);
  side_ = pipeline_.resized_crop > 0 ? pipeline_.resized_crop : pipeline_.center_crop;
  FANOUT_USER_CHECK(side_ > 0) << "dataset '" << name
                               << "': image files need --augment to give the size the model sees: "
                                  "random-resized-crop:S or center-crop:S (e.g. random-resized-crop:224,flip)";
  FANOUT_CHECK(pipeline_.crop_padding < 0) << "crop:P on image files";
  if (mean_.empty()) mean_.assign(3, 0.f), std_.assign(3, 1.f);
}

void ImageFileDataset::set_shards(std::vector<int64_t> sizes, int64_t buffer) {
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  FANOUT_CHECK(n == size()) << "shards of " << n << " samples for " << size();
  shard_sizes_ = std::move(sizes);
  shuffle_buffer_ = buffer;
}

std::unique_ptr<Sampler> ImageFileDataset::training_sampler(int world, int rank, uint64_t seed, bool drop_last) const {
  if (shard_sizes_.empty()) return nullptr;
  return std::make_unique<ShardBufferSampler>(shard_sizes_, world, rank, seed, shuffle_buffer_, drop_last);
}

void ImageFileDataset::check(const Augment& augment) const {
  FANOUT_USER_CHECK(!augment.any() || augment.str() == pipeline_.str())
      << "dataset '" << name << "' was opened for --augment " << pipeline_.str() << ", not " << augment.str();
}

void ImageFileDataset::get(int64_t i, const SampleDraw& draw, void* x, void* y) const {
  FANOUT_USER_CHECK(0 <= i && i < size()) << "sample index " << i << " is out of range for dataset '" << name
                                          << "' with " << size() << " samples";
  if (!skip_bad_) return load(i, draw, static_cast<float*>(x), static_cast<int32_t*>(y));
  // The next good sample after a bad one (wrapping), drawn as itself: the same for every worker and rank.
  for (int64_t k = 0; k < size(); ++k) {
    const int64_t j = (i + k) % size();
    try {
      load(j, draw, static_cast<float*>(x), static_cast<int32_t*>(y));
      if (k > 0) skipped_.fetch_add(1);
      return;
    } catch (const fanout::Error& e) {
      std::lock_guard<std::mutex> g(reported_mu_);
      if (reported_.insert(j).second)
        std::fprintf(stderr, "warning: skipping a bad sample (--skip-bad-samples): %s\n", e.what());
    }
  }
  FANOUT_FAIL() << "dataset '" << name << "': no sample can be read or decoded";
}

void ImageFileDataset::load(int64_t i, const SampleDraw& draw, float* x, int32_t* y) const {
  const File& f = files_[static_cast<size_t>(i)];
  const std::string where = f.member.empty() ? f.path : f.path + ":" + f.member;
  thread_local std::vector<uint8_t> bytes;
  {
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    FANOUT_USER_CHECK(fd >= 0) << "cannot read image " << where << ": " << std::strerror(errno);
    struct Close {
      int fd;
      ~Close() { ::close(fd); }
    } close_fd{fd};
    bytes.clear();
    int64_t at = f.offset, left = f.size;  // left < 0: to the end
    uint8_t chunk[1 << 16];
    while (left != 0) {
      const size_t want = left < 0 ? sizeof chunk : static_cast<size_t>(std::min<int64_t>(left, sizeof chunk));
      const ssize_t got = ::pread(fd, chunk, want, at);
      FANOUT_USER_CHECK(got >= 0) << "cannot read image " << where << ": " << std::strerror(errno);
      if (got == 0) break;
      bytes.insert(bytes.end(), chunk, chunk + got);
      at += got;
      if (left > 0) left -= got;
    }
    FANOUT_USER_CHECK(left <= 0) << "cannot read image " << where << ": the file ends " << left
                                 << " bytes early (truncated)";
  }
  const bool train = draw.augment != nullptr && draw.augment->any();
  const int s = side_;
  thread_local std::vector<uint8_t> out;
  out.resize(static_cast<size_t>(s) * s * 3);
  const ImageSize full = image_size(bytes.data(), bytes.size(), where);
  if (pipeline_.resized_crop > 0 && train) {
    std::mt19937_64 rng(sample_bits(draw.seed, draw.epoch, i, DrawStream::ResizedCrop));
    const CropBox box = random_resized_crop_box(full.height, full.width, pipeline_.scale_min, pipeline_.scale_max,
                                                3.0 / 4.0, 4.0 / 3.0, rng);
    decode_resized(bytes.data(), bytes.size(), where, full, box, s, s, pipeline_.jpeg_draft, out.data());
  } else {
    const Augment p = pipeline_.resized_crop > 0 ? eval_pipeline(pipeline_) : pipeline_;
    thread_local Image img;
    if (p.resize > 0) {
      shorter_side_size(full.height, full.width, p.resize, img.height, img.width);
      img.rgb.resize(static_cast<size_t>(img.height) * img.width * 3);
      decode_resized(bytes.data(), bytes.size(), where, full, {0, 0, full.height, full.width}, img.height, img.width,
                     p.jpeg_draft, img.rgb.data());
    } else {
      img = decode_image(bytes.data(), bytes.size(), where);
    }
    crop_padded(img, center_crop_box(img.height, img.width, s), out.data());
  }
  const bool flip = pipeline_.hflip && train && (sample_bits(draw.seed, draw.epoch, i, DrawStream::Flip) >> 63) != 0;
  // HWC uint8 to CHW float: (v / 255 - mean) / std as one multiply-add, as ImageDataset::normalized.
  float* o = x;
  const size_t plane = static_cast<size_t>(s) * s;
  for (int c = 0; c < 3; ++c) {
    const float scale = 1.0f / (255.0f * std_[static_cast<size_t>(c)]);
    const float shift = -mean_[static_cast<size_t>(c)] / std_[static_cast<size_t>(c)];
    for (int r = 0; r < s; ++r) {
      const uint8_t* row = out.data() + static_cast<size_t>(r) * s * 3 + c;
      float* dst = o + c * plane + static_cast<size_t>(r) * s;
      for (int col = 0; col < s; ++col)
        dst[col] = static_cast<float>(row[3 * static_cast<size_t>(flip ? s - 1 - col : col)]) * scale + shift;
    }
  }
  *y = f.label;
}

namespace {

bool hidden(const fs::path& p) { return !p.filename().empty() && p.filename().string()[0] == '.'; }

std::string lower_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return e;
}

bool image_extension(const fs::path& p) {
  const std::string e = lower_extension(p);
  return e == ".jpg" || e == ".jpeg" || e == ".png";
}

// Files torchvision's ImageFolder reads (its IMG_EXTENSIONS) that fanout does not decode.
bool other_image_extension(const fs::path& p) {
  const std::string e = lower_extension(p);
  return e == ".bmp" || e == ".webp" || e == ".tif" || e == ".tiff" || e == ".ppm" || e == ".pgm";
}

// What a folder scan left out that torchvision's ImageFolder would have read: said once, in a warning.
struct Skipped {
  int64_t files = 0;
  std::string example;
  void add(const fs::path& p) {
    if (files++ == 0) example = p.string();
  }
};

// A class folder's images, in torchvision's order: folders by path, then names.
std::vector<std::string> class_files(const fs::path& dir, Skipped& skipped) {
  std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
  FANOUT_USER_CHECK(!ec) << "cannot list " << dir.string() << ": " << ec.message();
  // The folders above the current entry, resolved, up to the root: a folder
  // that resolves to one of them is a symbolic link loop (one to "." or ".."
  // included, which the kernel's 40-link limit would otherwise turn into
  // files repeated).
  std::vector<fs::path> chain;
  for (fs::path a = fs::canonical(dir, ec); !ec && !a.empty(); a = a.parent_path()) {
    chain.insert(chain.begin(), a);
    if (a == a.root_path()) break;
  }
  const size_t above = chain.size();
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    FANOUT_USER_CHECK(!ec) << "cannot list " << dir.string() << ": " << ec.message();
    FANOUT_USER_CHECK(it.depth() < 64) << "folders nested past 64 levels under " << dir.string()
                                       << " (a symbolic link loop?)";
    const fs::path& p = it->path();
    if (hidden(p)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory(ec)) {
      fs::path real = fs::canonical(p, ec);
      FANOUT_USER_CHECK(!ec) << "cannot resolve " << p.string() << ": " << ec.message();
      chain.resize(above + static_cast<size_t>(it.depth()));
      FANOUT_USER_CHECK(std::find(chain.begin(), chain.end(), real) == chain.end())
          << p.string() << " is the folder " << real.string() << " above it again (a symbolic link loop)";
      chain.push_back(std::move(real));
      continue;
    }
    // Anything by an image's name but a folder, a broken link included: reading it names the problem.
    if (image_extension(p) && !it->is_directory(ec)) found.emplace_back(p.parent_path().string(), p.filename().string());
    else if (other_image_extension(p)) skipped.add(p);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> files;
  for (auto& [folder, fname] : found) files.push_back(folder + "/" + fname);
  return files;
}

std::vector<std::string> class_names(const fs::path& split) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(split, ec), end; !ec && it != end; it.increment(ec))
    if (!hidden(it->path()) && it->is_directory(ec)) names.push_back(it->path().filename().string());
  FANOUT_USER_CHECK(!ec) << "cannot list " << split.string() << ": " << ec.message();
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

void check_image_dir(const char* kind, const std::string& dir) {
  FANOUT_USER_CHECK(!dir.empty()) << "bad dataset '" << kind << ":': give its directory (" << kind << ":DIR)";
  FANOUT_USER_CHECK(fs::is_directory(dir)) << kind << ":" << dir << ": no such directory";
}

void check_output_size(const char* kind, const std::string& dir, const Augment& augment) {
  FANOUT_USER_CHECK(augment.resized_crop > 0 || augment.center_crop > 0)
      << kind << ":" << dir << ": image files need --augment to give the size the model sees: "
      << "random-resized-crop:S or center-crop:S (e.g. random-resized-crop:224,flip)";
}

ImageFolderSplits open_image_folder(const std::string& dir, const Augment& augment, const std::string& normalize,
                                    bool skip_bad) {
  check_image_dir("imagefolder", dir);
  const fs::path root(dir);
  for (const char* split : {"train", "val"})
    FANOUT_USER_CHECK(fs::is_directory(root / split))
        << "imagefolder:" << dir << " has no " << split << " folder (expected " << dir << "/train/<class>/... and "
        << dir << "/val/<class>/...)";
  check_output_size("imagefolder", dir, augment);
  std::vector<float> mean, std;
  parse_normalize(normalize, mean, std);
  const std::vector<std::string> classes = class_names(root / "train");
  FANOUT_USER_CHECK(!classes.empty()) << "imagefolder:" << dir << "/train has no class folders";
  const std::vector<std::string> val_classes = class_names(root / "val");
  FANOUT_USER_CHECK(val_classes == classes)
      << "imagefolder:" << dir << ": val has " << val_classes.size() << " class folders and train " << classes.size()
      << (val_classes.size() == classes.size() ? ", named differently" : "")
      << " (the same classes in both, or the indices would differ)";
  ImageFolderSplits s;
  Skipped skipped;
  for (const char* split : {"train", "val"}) {
    std::vector<ImageFileDataset::File> files;
    for (size_t c = 0; c < classes.size(); ++c) {
      const fs::path folder = root / split / classes[c];
      const auto names = class_files(folder, skipped);
      FANOUT_USER_CHECK(!names.empty()) << "class folder " << folder.string() << " has no .jpg, .jpeg or .png files";
      for (const auto& n : names) {
        ImageFileDataset::File f;
        f.path = n;
        f.label = static_cast<int32_t>(c);
        files.push_back(std::move(f));
      }
    }
    const bool train = std::strcmp(split, "train") == 0;
    auto ds = std::make_shared<ImageFileDataset>(std::move(files), classes, train ? augment : eval_pipeline(augment),
                                                 mean, std, "imagefolder:" + dir + "/" + split, skip_bad);
    (train ? s.train : s.val) = std::move(ds);
  }
  if (skipped.files > 0)
    s.warnings.push_back("imagefolder:" + dir + ": " + std::to_string(skipped.files) + " file" +
                         (skipped.files == 1 ? "" : "s") +
                         " that torchvision's ImageFolder would read left out (.bmp, .webp, .tif, .ppm, .pgm: "
                         "fanout decodes .jpg, .jpeg and .png), such as " + skipped.example);
  return s;
}

}  // namespace fanout::data
