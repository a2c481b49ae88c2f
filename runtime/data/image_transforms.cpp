// RandomResizedCrop's boxes, Resize's and CenterCrop's sizes, and Pillow's antialiased bilinear resampling.
#include "runtime/data/image_transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/seeded.h"

namespace fanout::data {

namespace {

// Python's round(): half to even (the default floating-point rounding mode).
int round_even(double v) { return static_cast<int>(std::nearbyint(v)); }

int uniform_int(std::mt19937_64& rng, int n) {  // [0, n)
  return static_cast<int>((static_cast<unsigned __int128>(rng()) * static_cast<uint64_t>(n)) >> 64);
}

// Pillow's precompute_coeffs for the bilinear (triangle) filter: output
// pixel i of `out` covers input [in0, in1) of `in`; its taps start at
// first[i], count[i] of them, weights w[i * taps ...] normalized to 1.
struct Taps {
  int taps = 0;
  std::vector<int> first, count;
  std::vector<float> w;
};

Taps bilinear_taps(int in, double in0, double in1, int out) {
  const double scale = (in1 - in0) / out;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle's support is 1
  Taps t;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out));
  t.count.resize(static_cast<size_t>(out));
  t.w.assign(static_cast<size_t>(out) * t.taps, 0.f);
  std::vector<double> k(static_cast<size_t>(t.taps));
  for (int i = 0; i < out; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    // Pillow truncates toward zero here (a C cast), then clamps.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in);
    const int n = std::max(hi - lo, 0);
    double sum = 0;
    for (int x = 0; x < n; ++x) {
      const double d = std::abs((x + lo - center + 0.5) / filterscale);
      k[static_cast<size_t>(x)] = d < 1.0 ? 1.0 - d : 0.0;
      sum += k[static_cast<size_t>(x)];
    }
    t.first[static_cast<size_t>(i)] = lo;
    t.count[static_cast<size_t>(i)] = n;
    for (int x = 0; x < n; ++x)
      t.w[static_cast<size_t>(i) * t.taps + x] = static_cast<float>(sum != 0 ? k[static_cast<size_t>(x)] / sum : 0.0);
  }
  return t;
}

}  // namespace

CropBox random_resized_crop_box(int height, int width, double scale_min, double scale_max, double ratio_min,
                                double ratio_max, std::mt19937_64& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale_min + (scale_max - scale_min) * uniform01(rng));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform01(rng));
    const int w = round_even(std::sqrt(target * aspect));
    const int h = round_even(std::sqrt(target / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = uniform_int(rng, height - h + 1);
      const int left = uniform_int(rng, width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < ratio_min) {
    h = round_even(w / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = round_even(h * ratio_max);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

void shorter_side_size(int height, int width, int size, int& out_height, int& out_width) {
  if (height <= width) {
    out_height = size;
    out_width = static_cast<int>(static_cast<int64_t>(size) * width / height);
  } else {
    out_width = size;
    out_height = static_cast<int>(static_cast<int64_t>(size) * height / width);
  }
}

CropBox center_crop_box(int height, int width, int size) {
  // A side shorter than size is padded first, (size - side) // 2 before it, so the crop starts there.
  auto start = [&](int side) { return side < size ? -((size - side) / 2) : round_even((side - size) / 2.0); };
  return {start(height), start(width), size, size};
}

void resize_bilinear(const Image& src, const CropBox& box, int out_height, int out_width, uint8_t* dst) {
  FANOUT_CHECK(box.top >= 0 && box.left >= 0 && box.height > 0 && box.width > 0 &&
               box.top + box.height <= src.height && box.left + box.width <= src.width && out_height > 0 &&
               out_width > 0)
      << "resize of box (" << box.top << ", " << box.left << ", " << box.height << ", " << box.width << ") of a "
      << src.height << "x" << src.width << " image to " << out_height << "x" << out_width;
  // Taps over the box alone: what lies outside it is not part of the cropped image.
  const Taps tx = bilinear_taps(box.width, 0, box.width, out_width);
  const Taps ty = bilinear_taps(box.height, 0, box.height, out_height);
  // Horizontal pass over the box's rows into float, then vertical, rounding once.
  thread_local std::vector<float> mid;
  mid.resize(static_cast<size_t>(box.height) * out_width * 3);
  for (int y = 0; y < box.height; ++y) {
    const uint8_t* row = src.rgb.data() + (static_cast<size_t>(box.top + y) * src.width + box.left) * 3;
    float* m = mid.data() + static_cast<size_t>(y) * out_width * 3;
    for (int x = 0; x < out_width; ++x) {
      const float* w = &tx.w[static_cast<size_t>(x) * tx.taps];
      const uint8_t* p = row + static_cast<size_t>(tx.first[static_cast<size_t>(x)]) * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0, n = tx.count[static_cast<size_t>(x)]; k < n; ++k, p += 3) {
        r += w[k] * p[0];
        g += w[k] * p[1];
        b += w[k] * p[2];
      }
      m[3 * x] = r;
      m[3 * x + 1] = g;
      m[3 * x + 2] = b;
    }
  }
  const size_t row_len = static_cast<size_t>(out_width) * 3;
  thread_local std::vector<float> acc;
  acc.resize(row_len);
  for (int y = 0; y < out_height; ++y) {
    std::fill(acc.begin(), acc.end(), 0.f);
    const float* w = &ty.w[static_cast<size_t>(y) * ty.taps];
    for (int k = 0, n = ty.count[static_cast<size_t>(y)]; k < n; ++k) {
      const float* m = mid.data() + static_cast<size_t>(ty.first[static_cast<size_t>(y)] + k) * row_len;
      const float wk = w[k];
      for (size_t i = 0; i < row_len; ++i) acc[i] += wk * m[i];
    }
    uint8_t* out = dst + static_cast<size_t>(y) * row_len;
    for (size_t i = 0; i < row_len; ++i) out[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(acc[i]), 0.f, 255.f));
  }
}

void crop_padded(const Image& src, const CropBox& box, uint8_t* dst) {
  std::memset(dst, 0, static_cast<size_t>(box.height) * box.width * 3);
  const int y0 = std::max(box.top, 0), y1 = std::min(box.top + box.height, src.height);
  const int x0 = std::max(box.left, 0), x1 = std::min(box.left + box.width, src.width);
  for (int y = y0; y < y1; ++y)
    if (x1 > x0)
      std::memcpy(dst + (static_cast<size_t>(y - box.top) * box.width + (x0 - box.left)) * 3,
                  src.rgb.data() + (static_cast<size_t>(y) * src.width + x0) * 3, static_cast<size_t>(x1 - x0) * 3);
}

}  // namespace fanout::data
