// Augmentation specs and load_sample: counter-based random crop and flip, then normalization.
#include "runtime/data/transforms.h"

#include <algorithm>
#include <charconv>

#include "runtime/core/error.h"
#include "runtime/data/seeded.h"

namespace fanout::data {

namespace {

constexpr int kDefaultCropPadding = 4;
constexpr int kMaxCropPadding = 1024;  // past that it is a typo
constexpr const char* kSpecForms = "none, flip, crop, crop:P, crop:P,flip or flip,crop:P";

// Independent streams of draws per sample, so the flip does not depend on whether crop is on.
enum Stream : uint64_t { kFlip = 1, kCropRow = 2, kCropCol = 3 };

uint64_t draw(uint64_t seed, int64_t epoch, int64_t index, Stream s) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(epoch));
  h = splitmix64(h ^ static_cast<uint64_t>(index));
  return splitmix64(h ^ s);
}

// Maps 64 random bits to [0, range) by a 128-bit multiply (bias below 2^-50 for these ranges).
int64_t below(uint64_t bits, uint64_t range) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * range) >> 64);
}

}  // namespace

std::string Augment::str() const {
  std::string s;
  if (crop_padding >= 0) s = "crop:" + std::to_string(crop_padding);
  if (hflip) s += s.empty() ? "flip" : ",flip";
  return s.empty() ? "none" : s;
}

Augment parse_augment(const std::string& spec) {
  Augment a;
  if (spec == "none") return a;
  bool crop = false;
  size_t begin = 0;
  while (true) {
    const size_t comma = spec.find(',', begin);
    const std::string part = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    if (part == "flip" && !a.hflip) {
      a.hflip = true;
    } else if (part == "crop" && !crop) {
      crop = true;
      a.crop_padding = kDefaultCropPadding;
    } else if (part.rfind("crop:", 0) == 0 && !crop) {
      crop = true;
      const char* b = part.data() + 5;
      const char* e = part.data() + part.size();
      int p = -1;
      const auto [end, ec] = std::from_chars(b, e, p);
      FANOUT_USER_CHECK(b != e && ec == std::errc() && end == e && p >= 0 && p <= kMaxCropPadding)
          << "bad augmentation '" << spec << "': crop:P needs a whole number of padding pixels P in 0.."
          << kMaxCropPadding;
      a.crop_padding = p;
    } else {
      FANOUT_FAIL() << "bad augmentation '" << spec << "' (expected " << kSpecForms << ")";
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return a;
}

void load_sample(const ImageDataset& ds, int64_t index, const Augment& aug, uint64_t seed, int64_t epoch,
                 float* out) {
  const int64_t rows = ds.images.defined() ? std::min(ds.size(), ds.images.size(0)) : 0;
  FANOUT_USER_CHECK(0 <= index && index < rows)
      << "sample index " << index << " is out of range for dataset '" << ds.name << "' with " << rows << " samples";
  if (!aug.any()) {
    ds.normalized(index, out);
    return;
  }
  FANOUT_USER_CHECK(ds.images.dim() == 4 && ds.images.dtype() == DType::U8)
      << "dataset '" << ds.name << "': augmentation is for uint8 (N, C, H, W) images";
  const Shape s = ds.sample_shape();  // (C, H, W)
  const int64_t c = s[0], h = s[1], w = s[2];
  const bool flip = aug.hflip && (draw(seed, epoch, index, kFlip) >> 63) != 0;
  // RandomCrop draws the window's corner in [0, 2P] of the padded image: a shift by [-P, P] of the original.
  int64_t dy = 0, dx = 0;
  if (aug.crop_padding > 0) {
    const uint64_t p = static_cast<uint64_t>(aug.crop_padding);
    dy = below(draw(seed, epoch, index, kCropRow), 2 * p + 1) - aug.crop_padding;
    dx = below(draw(seed, epoch, index, kCropCol), 2 * p + 1) - aug.crop_padding;
  }
  // Output (y, x) reads source row y + dy and column (flip ? w - 1 - x : x) + dx; outside is padding (0).
  const int64_t x_lo = flip ? std::max<int64_t>(0, dx) : std::max<int64_t>(0, -dx);
  const int64_t x_hi = flip ? std::min(w, w + dx) : std::min(w, w - dx);
  const uint8_t* img = ds.images.data<uint8_t>() + index * c * h * w;
  for (int64_t ch = 0; ch < c; ++ch) {
    // The same multiply-add as ImageDataset::normalized, so results agree bit for bit.
    const auto [m, sd] = ds.channel_stats(ch);
    const float scale = 1.0f / (255.0f * sd), shift = -m / sd;
    const float zero = static_cast<float>(0) * scale + shift;
    for (int64_t y = 0; y < h; ++y) {
      float* row = out + (ch * h + y) * w;
      const int64_t sy = y + dy;
      if (sy < 0 || sy >= h || x_lo >= x_hi) {
        std::fill(row, row + w, zero);
        continue;
      }
      const uint8_t* src = img + (ch * h + sy) * w;
      std::fill(row, row + x_lo, zero);
      if (flip)
        for (int64_t x = x_lo; x < x_hi; ++x) row[x] = static_cast<float>(src[w - 1 - x + dx]) * scale + shift;
      else
        for (int64_t x = x_lo; x < x_hi; ++x) row[x] = static_cast<float>(src[x + dx]) * scale + shift;
      std::fill(row + x_hi, row + w, zero);
    }
  }
}

}  // namespace fanout::data
