// Seeded synthetic 10-class image set (3, 32, 32): a smooth per-class pattern plus noise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/seeded.h"

namespace fanout::data {

namespace detail {
// Per-channel mean and std of uint8 images (N, C, H, W) on the [0, 1] scale (dataset.cpp).
void channel_mean_std(const Tensor& images, std::vector<float>& mean, std::vector<float>& std);
}  // namespace detail

namespace {

constexpr int kClasses = 10;
constexpr int64_t kC = 3, kH = 32, kW = 32;

// Class colours (tab10 palette), RGB on [0, 255].
constexpr double kColour[kClasses][3] = {{31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},
                                         {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                         {188, 189, 34},  {23, 190, 207}};

// A plane wave per class: orientation c * 18 degrees, 2 to 3.5 cycles across
// the image, its own phase. Returns its phase at every pixel, (H, W).
std::vector<double> class_phase(int c) {
  const double pi = std::numbers::pi;
  const double theta = c * pi / kClasses, cycles = 2.0 + 0.75 * (c % 3), phi = 0.7 * c;
  std::vector<double> out(static_cast<size_t>(kH * kW));
  for (int64_t y = 0; y < kH; ++y)
    for (int64_t x = 0; x < kW; ++x)
      out[y * kW + x] = 2 * pi * cycles * (x * std::cos(theta) + y * std::sin(theta)) / kW + phi;
  return out;
}

// Fills n samples: random label, the class pattern with a random amplitude and
// a small phase jitter, tinted by the class colour, plus per-pixel noise
// (a sum of four uniforms: near-Gaussian, sd ~ 17 grey levels).
ImageDataset generate(int64_t n, uint64_t stream_seed, const std::string& name) {
  static const std::vector<std::vector<double>> phase = [] {
    std::vector<std::vector<double>> p;
    for (int c = 0; c < kClasses; ++c) p.push_back(class_phase(c));
    return p;
  }();
  std::mt19937_64 rng(stream_seed);
  ImageDataset ds;
  ds.name = name;
  ds.num_classes = kClasses;
  ds.images = Tensor::empty(Shape{n, kC, kH, kW}, DType::U8);  // (N, 3, 32, 32)
  ds.labels = Tensor::empty(Shape{n}, DType::I32);              // (N)
  uint8_t* img = ds.images.data<uint8_t>();
  int32_t* lab = ds.labels.data<int32_t>();
  std::vector<double> wave(static_cast<size_t>(kH * kW));
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(((rng() >> 32) * kClasses) >> 32);
    lab[i] = c;
    const double amp = 0.75 + 0.5 * uniform01(rng), jitter = uniform01(rng) - 0.5;
    for (int64_t k = 0; k < kH * kW; ++k) wave[k] = 0.55 + 0.45 * amp * std::sin(phase[c][k] + jitter);
    uint8_t* out = img + i * kC * kH * kW;
    for (int64_t ch = 0; ch < kC; ++ch)
      for (int64_t k = 0; k < kH * kW; ++k) {
        const uint64_t r = rng();
        const double u4 = static_cast<double>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
        const double noise = (u4 / 65535.0 - 2.0) * 30.0;
        const double v = kColour[c][ch] * wave[k] + noise;
        out[ch * kH * kW + k] = static_cast<uint8_t>(std::clamp(std::floor(v + 0.5), 0.0, 255.0));
      }
  }
  return ds;
}

}  // namespace

TrainTest make_synthetic(int64_t n_train, uint64_t seed) {
  FANOUT_USER_CHECK(n_train >= 1) << "synthetic: needs at least 1 training sample, got " << n_train;
  TrainTest tt;
  // Two streams of the same seed: train and test never share samples' noise.
  tt.train = generate(n_train, splitmix64(seed), "synthetic/train");
  tt.test = generate(std::max<int64_t>(n_train / 5, 10), splitmix64(seed ^ 0x5EED7E57D47A5E7Bull), "synthetic/test");
  detail::channel_mean_std(tt.train.images, tt.train.mean, tt.train.std);
  tt.test.mean = tt.train.mean;  // normalize both splits with the train statistics
  tt.test.std = tt.train.std;
  return tt;
}

}  // namespace fanout::data
