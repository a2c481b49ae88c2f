// Datasets: the interface's checks, TensorDataset, ImageDataset's samples
// (shape, normalization, channel statistics) and the --data spec parser.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"

#include <cstring>
#include "runtime/data/keypoints.h"
#include "runtime/data/transforms.h"

namespace fanout::data {

namespace detail {

// Per-channel mean and std (population) of uint8 images (N, C, H, W), on the
// [0, 1] scale. Counts a 256-bin histogram per channel, so the sums are exact.
void channel_mean_std(const Tensor& images, std::vector<float>& mean, std::vector<float>& std) {
  FANOUT_CHECK(images.dim() == 4 && images.dtype() == DType::U8) << "expected (N, C, H, W) uint8 images";
  const int64_t n = images.size(0), c = images.size(1), hw = images.size(2) * images.size(3);
  std::vector<std::vector<uint64_t>> hist(static_cast<size_t>(c), std::vector<uint64_t>(256, 0));
  const uint8_t* p = images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      uint64_t* h = hist[ch].data();
      for (int64_t k = 0; k < hw; ++k) ++h[*p++];
    }
  mean.assign(static_cast<size_t>(c), 0.0f);
  std.assign(static_cast<size_t>(c), 1.0f);
  for (int64_t ch = 0; ch < c; ++ch) {
    double cnt = 0, s = 0, s2 = 0;
    for (int v = 0; v < 256; ++v) {
      const double k = static_cast<double>(hist[ch][v]), x = v / 255.0;
      cnt += k;
      s += k * x;
      s2 += k * x * x;
    }
    if (cnt == 0) continue;
    const double m = s / cnt, var = std::max(0.0, s2 / cnt - m * m);
    mean[ch] = static_cast<float>(m);
    // A constant channel would divide by zero; leave its std at 1.
    std[ch] = var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f;
  }
}

}  // namespace detail

Shape ImageDataset::sample_shape() const {
  FANOUT_CHECK(images.defined() && (images.dim() == 4 || images.dim() == 5))
      << "dataset '" << name << "' has no (N, C, H, W) images or (N, C, D, H, W) volumes";
  Shape s;
  s.ndim = images.dim() - 1;
  for (int i = 0; i < s.ndim; ++i) s.d[i] = images.size(i + 1);
  return s;
}

Shape ImageDataset::target_shape() const {
  if (!dense_targets()) return Shape{};
  Shape t = sample_shape();  // (C, spatial...) -> (K, spatial...)
  t.d[0] = landmarks.size(1);
  return t;
}

std::pair<float, float> ImageDataset::channel_stats(int64_t c) const {
  if (mean.empty() && std.empty()) return {0.0f, 1.0f};
  return {mean[c], std[c]};
}

void ImageDataset::normalized(int64_t i, float* out) const {
  FANOUT_CHECK(0 <= i && i < size()) << "sample " << i << " of dataset '" << name << "' with " << size();
  const Shape s = sample_shape();  // (C, spatial...)
  const int64_t c = s[0], plane = s.numel() / c;
  if (images.dtype() == DType::F32) {
    const float* x = images.f32() + i * c * plane;
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto [m, sd] = channel_stats(ch);
      const float scale = 1.0f / sd, shift = -m / sd;
      for (int64_t k = 0; k < plane; ++k) out[ch * plane + k] = x[ch * plane + k] * scale + shift;
    }
    return;
  }
  FANOUT_CHECK(images.dtype() == DType::U8) << "dataset '" << name << "' has " << dtype_name(images.dtype())
                                            << " images (expected uint8 or float32)";
  const uint8_t* x = images.data<uint8_t>() + i * c * plane;
  for (int64_t ch = 0; ch < c; ++ch) {
    // (x / 255 - mean) / std as one multiply-add.
    const auto [m, sd] = channel_stats(ch);
    const float scale = 1.0f / (255.0f * sd), shift = -m / sd;
    for (int64_t k = 0; k < plane; ++k) out[ch * plane + k] = static_cast<float>(x[ch * plane + k]) * scale + shift;
  }
}

void ImageDataset::get(int64_t i, const SampleDraw& draw, void* x, void* y) const {
  load_sample(*this, i, draw.augment ? *draw.augment : Augment{}, draw.seed, draw.epoch,
              static_cast<float*>(x));  // checks i
  if (dense_targets()) render_target(i, static_cast<float*>(y));
  else *static_cast<int32_t*>(y) = labels.data<int32_t>()[i];
}

void ImageDataset::check(const Augment& augment) const {
  FANOUT_USER_CHECK(!augment.for_files())
      << "dataset '" << name << "': random-resized-crop, resize, center-crop and jpeg-draft are for image files "
      << "(imagefolder:DIR, wds:DIR); in-memory sets take crop:P and flip";
  FANOUT_USER_CHECK(images.defined() && (images.dim() == 4 || images.dim() == 5) &&
                    (images.dtype() == DType::U8 || images.dtype() == DType::F32))
      << "dataset '" << name << "' has no (N, C, H, W) or (N, C, D, H, W) uint8 or float32 images"
      << " (TensorDataset takes samples of any shape)";
  const int64_t c = images.size(1);
  FANOUT_USER_CHECK((mean.empty() && std.empty()) ||
                    (static_cast<int64_t>(mean.size()) == c && static_cast<int64_t>(std.size()) == c))
      << "dataset '" << name << "' has " << mean.size() << " means and " << std.size() << " stds for " << c
      << " channels (give one of each per channel, or neither)";
  for (float v : std) FANOUT_USER_CHECK(v > 0 && std::isfinite(v)) << "dataset '" << name << "' has std " << v;
  if (dense_targets()) {
    FANOUT_USER_CHECK(landmarks.dim() == 3 && landmarks.dtype() == DType::F32 && landmarks.size(0) == size() &&
                      landmarks.size(2) == images.dim() - 2)
        << "dataset '" << name << "' has landmarks " << landmarks.shape().str() << " for images "
        << images.shape().str() << " (expected (N, K, " << images.dim() - 2 << ") float32)";
    FANOUT_USER_CHECK(!augment.any())
        << "dataset '" << name << "': augmentation is for image classification; it would move the landmarks";
  } else {
    FANOUT_USER_CHECK(labels.defined() && labels.dim() == 1 && labels.dtype() == DType::I32)
        << "dataset '" << name << "' has no (N) int32 labels";
    FANOUT_USER_CHECK(images.size(0) == labels.size(0))
        << "dataset '" << name << "' has " << images.size(0) << " images but " << labels.size(0) << " labels";
    FANOUT_USER_CHECK(!augment.any() || images.dim() == 4)
        << "dataset '" << name << "': augmentation is for (N, C, H, W) images";
  }
}

std::unique_ptr<Sampler> Dataset::training_sampler(int, int, uint64_t, bool) const { return nullptr; }

void Dataset::check(const Augment& augment) const {
  FANOUT_USER_CHECK(!augment.any()) << "dataset '" << name << "' cannot be augmented (crop and flip are for images)";
}

TensorDataset::TensorDataset(Tensor inputs, Tensor targets, std::string n)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  name = std::move(n);
  FANOUT_USER_CHECK(inputs_.defined() && inputs_.dim() >= 1 &&
                    (inputs_.dtype() == DType::F32 || inputs_.dtype() == DType::I32) && inputs_.device().is_cpu())
      << "TensorDataset '" << name << "': inputs must be a (N, ...) float32 or int32 tensor on the CPU, got "
      << (inputs_.defined() ? inputs_.shape().str() + " " + dtype_name(inputs_.dtype()) + " on " +
                                  inputs_.device().str()
                            : std::string("none"));
  FANOUT_USER_CHECK(targets_.defined() && targets_.dim() >= 1 && targets_.device().is_cpu() &&
                    (targets_.dtype() == DType::F32 || targets_.dtype() == DType::I32))
      << "TensorDataset '" << name << "': targets must be (N, ...) int32 class indices or float32 on the CPU, got "
      << (targets_.defined() ? targets_.shape().str() + " " + dtype_name(targets_.dtype()) : std::string("none"));
  FANOUT_USER_CHECK(targets_.size(0) == inputs_.size(0))
      << "TensorDataset '" << name << "' has " << inputs_.size(0) << " inputs but " << targets_.size(0) << " targets";
  kind_ = targets_.dtype() == DType::I32 ? TargetKind::ClassIndex : TargetKind::Dense;
  if (kind_ == TargetKind::ClassIndex) {
    // Class indices, or -1: a sample (a position) the loss ignores, as nanoGPT's ignore_index=-1.
    const int64_t per = targets_.numel() / std::max<int64_t>(1, targets_.size(0));
    for (int64_t i = 0; i < targets_.numel(); ++i) {
      FANOUT_USER_CHECK(targets_.data<int32_t>()[i] >= -1)
          << "TensorDataset '" << name << "': label " << targets_.data<int32_t>()[i] << " of sample " << i / per
          << " is below -1 (the ignored index)";
    }
  }
  sample_.ndim = inputs_.dim() - 1;
  for (int d = 0; d < sample_.ndim; ++d) sample_.d[d] = inputs_.size(d + 1);
  target_.ndim = targets_.dim() - 1;
  for (int d = 0; d < target_.ndim; ++d) target_.d[d] = targets_.size(d + 1);
}

void TensorDataset::get(int64_t i, const SampleDraw&, void* x, void* y) const {
  FANOUT_USER_CHECK(0 <= i && i < size())
      << "sample index " << i << " is out of range for dataset '" << name << "' with " << size() << " samples";
  const size_t n = static_cast<size_t>(sample_.numel()) * 4, m = static_cast<size_t>(target_.numel()) * 4;
  std::memcpy(x, static_cast<const char*>(inputs_.raw()) + static_cast<size_t>(i) * n, n);  // float32 and int32 alike
  std::memcpy(y, static_cast<const char*>(targets_.raw()) + static_cast<size_t>(i) * m, m);
}

void ImageDataset::render_target(int64_t i, float* out) const {
  FANOUT_CHECK(dense_targets()) << "dataset '" << name << "' has class labels, not landmarks";
  FANOUT_CHECK(0 <= i && i < landmarks.size(0)) << "sample " << i << " of dataset '" << name << "' with "
                                                << landmarks.size(0) << " landmark sets";
  const Tensor lm = landmarks.slice(i, i + 1).view(Shape{landmarks.size(1), landmarks.size(2)});
  render_heatmaps(lm, heatmap, Tensor::wrap(out, target_shape(), DType::F32, Device::cpu()));
}

namespace {

constexpr const char* kSpecForms =
    "fashion-mnist[:DIR], cifar10:DIR, synthetic[:N], keypoints3d:DIR or synthetic3d[:N]";
constexpr int64_t kDefaultSynthetic = 2048;
constexpr int64_t kDefaultSynthetic3d = 512;
constexpr int64_t kMaxSynthetic3d = 100'000;  // 3.3 GB of 32^3 volumes
constexpr int64_t kMaxSynthetic = 10'000'000;  // 30 GB of images: past that it is a typo

}  // namespace

namespace {
// Train and test splits must fit one model: same sample shape and classes.
TrainTest checked(TrainTest t, const std::string& spec) {
  FANOUT_USER_CHECK(t.train.sample_shape() == t.test.sample_shape())
      << "dataset '" << spec << "': training images are " << t.train.sample_shape().str() << " but test images are "
      << t.test.sample_shape().str();
  FANOUT_USER_CHECK(t.train.num_classes == t.test.num_classes)
      << "dataset '" << spec << "': " << t.train.num_classes << " training classes but " << t.test.num_classes
      << " test classes";
  FANOUT_USER_CHECK(t.train.dense_targets() == t.test.dense_targets() &&
                    t.train.target_shape() == t.test.target_shape())
      << "dataset '" << spec << "': training targets are " << t.train.target_shape().str() << " but test targets are "
      << t.test.target_shape().str();
  return t;
}
}  // namespace

namespace {
// The N of "KIND:N" (or `fallback` without it).
int64_t sample_count(const std::string& spec, const std::string& kind, bool has_arg, const std::string& arg,
                     int64_t fallback, int64_t most) {
  if (!has_arg) return fallback;
  int64_t n = 0;
  const char* b = arg.data();
  const char* e = b + arg.size();
  const auto [p, ec] = std::from_chars(b, e, n);
  FANOUT_USER_CHECK(!arg.empty() && ec == std::errc() && p == e && n >= 1 && n <= most)
      << "bad dataset '" << spec << "': " << kind << ":N needs a whole number of samples N in 1.." << most;
  return n;
}
}  // namespace

TrainTest open_dataset(const std::string& spec, uint64_t seed, const HeatmapSpec& heatmap) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const bool has_arg = colon != std::string::npos;
  const std::string arg = has_arg ? spec.substr(colon + 1) : "";

  if (kind == "fashion-mnist") {
    FANOUT_USER_CHECK(!has_arg || !arg.empty())
        << "bad dataset '" << spec << "': no directory after ':' (fashion-mnist:DIR)";
    return checked(load_fashion_mnist(has_arg ? arg : default_fashion_mnist_dir()), spec);
  }
  if (kind == "cifar10") {
    FANOUT_USER_CHECK(!arg.empty()) << "bad dataset '" << spec << "': cifar10 needs a directory (cifar10:DIR)";
    return checked(load_cifar10(arg), spec);
  }
  if (kind == "synthetic")
    return make_synthetic(sample_count(spec, kind, has_arg, arg, kDefaultSynthetic, kMaxSynthetic), seed);
  if (kind == "synthetic3d")
    return checked(make_synthetic3d(sample_count(spec, kind, has_arg, arg, kDefaultSynthetic3d, kMaxSynthetic3d), seed, heatmap),
                   spec);
  if (kind == "keypoints3d") {
    FANOUT_USER_CHECK(!arg.empty()) << "bad dataset '" << spec << "': keypoints3d needs a directory (keypoints3d:DIR)";
    return checked(load_keypoints3d(arg, heatmap), spec);
  }
  FANOUT_FAIL() << "unknown dataset '" << spec << "' (expected " << kSpecForms << ")";
}

}  // namespace fanout::data
