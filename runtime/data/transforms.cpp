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
constexpr const char* kSpecForms =
    "none, or comma-joined: flip, crop, crop:P; for image files random-resized-crop:S[:SMIN:SMAX], resize:S, "
    "center-crop:S, jpeg-draft";
constexpr int kMaxSide = 16384;  // output sides past that are a typo

uint64_t draw(uint64_t seed, int64_t epoch, int64_t index, DrawStream s) { return sample_bits(seed, epoch, index, s); }
constexpr DrawStream kFlip = DrawStream::Flip, kCropRow = DrawStream::CropRow, kCropCol = DrawStream::CropCol;

// Maps 64 random bits to [0, range) by a 128-bit multiply (bias below 2^-50 for these ranges).
int64_t below(uint64_t bits, uint64_t range) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * range) >> 64);
}

// A whole number in [lo, hi] from text, or a one-line error naming `what`.
int parse_int(const std::string& spec, const std::string& text, const char* what, int lo, int hi) {
  int v = 0;
  const char *b = text.data(), *e = b + text.size();
  const auto [end, ec] = std::from_chars(b, e, v);
  FANOUT_USER_CHECK(b != e && ec == std::errc() && end == e && v >= lo && v <= hi)
      << "bad augmentation '" << spec << "': " << what << " must be a whole number in " << lo << ".." << hi
      << ", got '" << text << "'";
  return v;
}

double parse_fraction(const std::string& spec, const std::string& text) {
  double v = -1;
  const char *b = text.data(), *e = b + text.size();
  const auto [end, ec] = std::from_chars(b, e, v);
  FANOUT_USER_CHECK(b != e && ec == std::errc() && end == e && v > 0 && v <= 1)
      << "bad augmentation '" << spec << "': random-resized-crop's scale bounds must be in (0, 1], got '" << text
      << "'";
  return v;
}

std::string fraction(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

uint64_t sample_bits(uint64_t seed, int64_t epoch, int64_t index, DrawStream s) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(epoch));
  h = splitmix64(h ^ static_cast<uint64_t>(index));
  return splitmix64(h ^ static_cast<uint64_t>(s));
}

std::string Augment::str() const {
  std::string s;
  auto add = [&](const std::string& part) {
    if (!s.empty()) s += ',';
    s += part;
  };
  if (resized_crop > 0) {
    std::string p = "random-resized-crop:" + std::to_string(resized_crop);
    if (scale_min != 0.08 || scale_max != 1.0) {
      p += ':';
      p += fraction(scale_min);
      p += ':';
      p += fraction(scale_max);
    }
    add(p);
  }
  if (resize > 0) add("resize:" + std::to_string(resize));
  if (center_crop > 0) add("center-crop:" + std::to_string(center_crop));
  if (crop_padding >= 0) add("crop:" + std::to_string(crop_padding));
  if (hflip) add("flip");
  if (jpeg_draft) add("jpeg-draft");
  return s.empty() ? "none" : s;
}

Augment parse_augment(const std::string& spec) {
  Augment a;
  if (spec == "none") return a;
  bool crop = false;
  size_t begin = 0;
  auto once = [&](bool seen, const std::string& part) {
    FANOUT_USER_CHECK(!seen) << "bad augmentation '" << spec << "': " << part.substr(0, part.find(':'))
                             << " appears twice (expected " << kSpecForms << ")";
  };
  while (true) {
    const size_t comma = spec.find(',', begin);
    const std::string part = spec.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const auto arg = [&](size_t prefix) { return part.substr(prefix); };
    if (part == "flip") {
      once(a.hflip, part);
      a.hflip = true;
    } else if (part == "crop") {
      once(crop, part);
      crop = true;
      a.crop_padding = kDefaultCropPadding;
    } else if (part.rfind("crop:", 0) == 0) {
      once(crop, part);
      crop = true;
      a.crop_padding = parse_int(spec, arg(5), "crop:P's padding P", 0, kMaxCropPadding);
    } else if (part.rfind("random-resized-crop:", 0) == 0) {
      once(a.resized_crop > 0, part);
      const std::string rest = arg(20);
      const size_t c1 = rest.find(':');
      a.resized_crop = parse_int(spec, rest.substr(0, c1), "random-resized-crop's size", 1, kMaxSide);
      if (c1 != std::string::npos) {
        const size_t c2 = rest.find(':', c1 + 1);
        FANOUT_USER_CHECK(c2 != std::string::npos)
            << "bad augmentation '" << spec << "': expected random-resized-crop:S or random-resized-crop:S:SMIN:SMAX";
        a.scale_min = parse_fraction(spec, rest.substr(c1 + 1, c2 - c1 - 1));
        a.scale_max = parse_fraction(spec, rest.substr(c2 + 1));
        FANOUT_USER_CHECK(a.scale_min <= a.scale_max)
            << "bad augmentation '" << spec << "': random-resized-crop's SMIN is above its SMAX";
      }
    } else if (part.rfind("resize:", 0) == 0) {
      once(a.resize > 0, part);
      // The pipeline runs in torchvision's order, resize then center-crop; the other order would be another one.
      FANOUT_USER_CHECK(a.center_crop == 0)
          << "bad augmentation '" << spec << "': resize goes before center-crop (resize:R,center-crop:S), the order "
          << "they run in";
      a.resize = parse_int(spec, arg(7), "resize's size", 1, kMaxSide);
    } else if (part == "jpeg-draft") {
      once(a.jpeg_draft, part);
      a.jpeg_draft = true;
    } else if (part.rfind("center-crop:", 0) == 0) {
      once(a.center_crop > 0, part);
      a.center_crop = parse_int(spec, arg(12), "center-crop's size", 1, kMaxSide);
    } else {
      FANOUT_FAIL() << "bad augmentation '" << spec << "' (expected " << kSpecForms << ")";
    }
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  FANOUT_USER_CHECK(a.resized_crop == 0 || (a.resize == 0 && a.center_crop == 0 && !crop))
      << "bad augmentation '" << spec << "': random-resized-crop makes the whole crop; it goes with flip alone";
  FANOUT_USER_CHECK(!a.jpeg_draft || a.resized_crop > 0 || a.resize > 0)
      << "bad augmentation '" << spec << "': jpeg-draft decodes JPEGs smaller before they are resized; it goes "
      << "with random-resized-crop or resize";
  FANOUT_USER_CHECK(!crop || !a.for_files())
      << "bad augmentation '" << spec << "': crop:P is for in-memory image sets; image files take "
      << "random-resized-crop, resize and center-crop";
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
