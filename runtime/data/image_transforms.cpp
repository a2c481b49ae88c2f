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

// Pillow's resampling (Resample.c, 8 bits a channel), step for step, so
// results equal Pillow's: coefficients of the triangle filter widened by the
// downscaling factor, normalized in double, then fixed point with 22
// fractional bits; each pass accumulates in int32 from half a unit and
// clips to 8 bits.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Taps {
  int ksize = 0;
  std::vector<int> lo, n;  // per output pixel: the first input pixel and how many
  std::vector<int32_t> k;  // ksize per output pixel
};

Taps bilinear_taps(int in_size, float in0, float in1, int out_size) {
  double scale = static_cast<double>(in1 - in0) / out_size;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;  // the triangle's support is 1
  Taps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.lo.resize(static_cast<size_t>(out_size));
  t.n.resize(static_cast<size_t>(out_size));
  t.k.assign(static_cast<size_t>(out_size) * t.ksize, 0);
  std::vector<double> k(static_cast<size_t>(t.ksize));
  const double inv_filterscale = 1.0 / filterscale;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    int xmin = static_cast<int>(center - support + 0.5);  // a C cast: toward zero
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    for (int x = 0; x < xmax; ++x) {
      double a = (x + xmin - center + 0.5) * inv_filterscale;
      if (a < 0.0) a = -a;
      const double w = a < 1.0 ? 1.0 - a : 0.0;
      k[static_cast<size_t>(x)] = w;
      ww += w;
    }
    if (ww != 0.0)
      for (int x = 0; x < xmax; ++x) k[static_cast<size_t>(x)] /= ww;
    t.lo[static_cast<size_t>(xx)] = xmin;
    t.n[static_cast<size_t>(xx)] = xmax;
    for (int x = 0; x < xmax; ++x) {
      const double v = k[static_cast<size_t>(x)];
      t.k[static_cast<size_t>(xx) * t.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits) : 0.5 + v * (1 << kPrecisionBits));
    }
  }
  return t;
}

inline uint8_t clip8(int32_t v) {
  const int32_t q = v >> kPrecisionBits;  // arithmetic shift, as Pillow's
  return static_cast<uint8_t>(q < 0 ? 0 : q > 255 ? 255 : q);
}

// An RGB plane: rows of `width` pixels, `stride` bytes apart.
struct Plane {
  const uint8_t* data;
  int width, height;
  size_t stride;
};

// Pillow's horizontal pass over rows [first, first + rows) of `in` into out (rows x taps' outputs).
void pass_horizontal(const Plane& in, int first, int rows, const Taps& t, uint8_t* out) {
  const int out_w = static_cast<int>(t.lo.size());
  for (int y = 0; y < rows; ++y) {
    const uint8_t* line = in.data + static_cast<size_t>(first + y) * in.stride;
    uint8_t* o = out + static_cast<size_t>(y) * out_w * 3;
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &t.k[static_cast<size_t>(xx) * t.ksize];
      const uint8_t* p = line + static_cast<size_t>(t.lo[static_cast<size_t>(xx)]) * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0, n = t.n[static_cast<size_t>(xx)]; x < n; ++x, p += 3) {
        s0 += p[0] * k[x];
        s1 += p[1] * k[x];
        s2 += p[2] * k[x];
      }
      o[3 * xx] = clip8(s0);
      o[3 * xx + 1] = clip8(s1);
      o[3 * xx + 2] = clip8(s2);
    }
  }
}

// Pillow's vertical pass: output row yy from input rows lo[yy] - shift onward.
void pass_vertical(const Plane& in, const Taps& t, int shift, uint8_t* out) {
  const int out_h = static_cast<int>(t.lo.size());
  const size_t row = static_cast<size_t>(in.width) * 3;
  std::vector<int32_t> acc(row);
  for (int yy = 0; yy < out_h; ++yy) {
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    const int32_t* k = &t.k[static_cast<size_t>(yy) * t.ksize];
    const int lo = t.lo[static_cast<size_t>(yy)] - shift;
    for (int y = 0, n = t.n[static_cast<size_t>(yy)]; y < n; ++y) {
      const uint8_t* p = in.data + static_cast<size_t>(lo + y) * in.stride;
      const int32_t ky = k[y];
      for (size_t i = 0; i < row; ++i) acc[i] += p[i] * ky;
    }
    uint8_t* o = out + static_cast<size_t>(yy) * row;
    for (size_t i = 0; i < row; ++i) o[i] = clip8(acc[i]);
  }
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
               box.top + box.height <= src.height && box.left + box.width <= src.width)
      << "resize of box (" << box.top << ", " << box.left << ", " << box.height << ", " << box.width << ") of a "
      << src.height << "x" << src.width << " image";
  resize_region(src, {double(box.top), double(box.left), double(box.top + box.height), double(box.left + box.width)},
                out_height, out_width, dst);
}

void resize_region(const Image& src, const Region& r, int out_height, int out_width, uint8_t* dst) {
  FANOUT_CHECK(r.top >= 0 && r.left >= 0 && r.bottom > r.top && r.right > r.left && r.bottom <= src.height &&
               r.right <= src.width && out_height > 0 && out_width > 0)
      << "resize of region (" << r.top << ", " << r.left << ")-(" << r.bottom << ", " << r.right << ") of a "
      << src.height << "x" << src.width << " image to " << out_height << "x" << out_width;
  // The pixels the region touches are the image Pillow resizes (torchvision
  // crops first): nothing outside them is read. An integer region is a crop
  // box, and in0 = 0, in1 = its size.
  const int y0 = static_cast<int>(std::floor(r.top)), x0 = static_cast<int>(std::floor(r.left));
  const int h = static_cast<int>(std::ceil(r.bottom)) - y0, w = static_cast<int>(std::ceil(r.right)) - x0;
  const float top = static_cast<float>(r.top - y0), bottom = static_cast<float>(r.bottom - y0);
  const float left = static_cast<float>(r.left - x0), right = static_cast<float>(r.right - x0);
  const Plane in{src.rgb.data() + (static_cast<size_t>(y0) * src.width + x0) * 3, w, h,
                 static_cast<size_t>(src.width) * 3};
  const bool need_h = out_width != w || left != 0.f || right != static_cast<float>(w);
  const bool need_v = out_height != h || top != 0.f || bottom != static_cast<float>(h);
  if (!need_h && !need_v) {
    for (int y = 0; y < h; ++y) std::memcpy(dst + static_cast<size_t>(y) * w * 3, in.data + y * in.stride, static_cast<size_t>(w) * 3);
    return;
  }
  const Taps tv = bilinear_taps(h, top, bottom, out_height);
  // Pillow runs the vertical pass first when the height shrinks more than twice as much as the width.
  const bool horizontal_first = !((h - out_height) > 0 && (h - out_height) > (w - out_width) * 2);
  thread_local std::vector<uint8_t> temp;
  if (horizontal_first) {
    if (need_h) {
      const int first = tv.lo.front(), last = tv.lo.back() + tv.n.back();
      const Taps th = bilinear_taps(w, left, right, out_width);
      uint8_t* to = need_v ? (temp.resize(static_cast<size_t>(last - first) * out_width * 3), temp.data()) : dst;
      pass_horizontal(in, need_v ? first : 0, need_v ? last - first : h, th, to);
      if (!need_v) return;
      pass_vertical({temp.data(), out_width, last - first, static_cast<size_t>(out_width) * 3}, tv, first, dst);
      return;
    }
    pass_vertical(in, tv, 0, dst);
    return;
  }
  uint8_t* to = need_h ? (temp.resize(static_cast<size_t>(out_height) * w * 3), temp.data()) : dst;
  pass_vertical(in, tv, 0, to);
  if (need_h)
    pass_horizontal({temp.data(), w, out_height, static_cast<size_t>(w) * 3}, 0, out_height,
                    bilinear_taps(w, left, right, out_width), dst);
}

int jpeg_draft_scale(double region_height, double region_width, int out_height, int out_width) {
  for (int d : {8, 4, 2})
    if (region_height / d >= kDraftMargin * out_height && region_width / d >= kDraftMargin * out_width) return d;
  return 1;
}

int decode_resized(const uint8_t* data, size_t size, const std::string& name, const ImageSize& full,
                   const CropBox& box, int out_height, int out_width, bool draft, uint8_t* dst) {
  const int d = draft && sniff_image(data, size) == ImageFormat::Jpeg
                    ? jpeg_draft_scale(box.height, box.width, out_height, out_width)
                    : 1;
  const Image img = decode_image(data, size, name, d);
  FANOUT_CHECK(img.width == (full.width + d - 1) / d && img.height == (full.height + d - 1) / d)
      << name << " decoded at 1/" << d << " as " << img.width << "x" << img.height << ", not from "
      << full.width << "x" << full.height;
  if (d == 1) {
    resize_bilinear(img, box, out_height, out_width, dst);
  } else {
    resize_region(img,
                  {double(box.top) / d, double(box.left) / d, double(box.top + box.height) / d,
                   double(box.left + box.width) / d},
                  out_height, out_width, dst);
  }
  return d;
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
