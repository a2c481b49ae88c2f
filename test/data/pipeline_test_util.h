// Helpers for the input-pipeline tests (samplers, transforms, loader): seeded
// random in-memory datasets and sample/batch comparisons.
#pragma once
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/data/dataset.h"

namespace fanout::testing {

// n samples (c, h, w) of seeded random bytes (never all zero), labels random
// in [0, 10), per-channel mean and std random (std >= 0.1).
inline data::ImageDataset random_image_dataset(int64_t n, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  data::ImageDataset ds;
  ds.name = "random";
  ds.images = Tensor::empty(Shape{n, c, h, w}, DType::U8);  // (N, C, H, W)
  ds.labels = Tensor::empty(Shape{n}, DType::I32);          // (N)
  uint8_t* px = ds.images.data<uint8_t>();
  for (int64_t k = 0; k < ds.images.numel(); ++k) px[k] = static_cast<uint8_t>(rng() >> 56);
  for (int64_t i = 0; i < n; ++i) ds.labels.data<int32_t>()[i] = static_cast<int32_t>(rng() % 10);
  std::uniform_real_distribution<float> mean(0.1f, 0.9f), sd(0.1f, 0.5f);
  for (int64_t ch = 0; ch < c; ++ch) {
    ds.mean.push_back(mean(rng));
    ds.std.push_back(sd(rng));
  }
  return ds;
}

inline std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

inline bool same_floats(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

}  // namespace fanout::testing
