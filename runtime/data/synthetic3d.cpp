// Seeded synthetic keypoint volumes: K blobs, each landmark its own shape and
// brightness, at random positions, over noise.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "runtime/core/error.h"
#include "runtime/data/keypoints.h"
#include "runtime/data/seeded.h"

namespace fanout::data {

namespace detail {
// Per-channel mean and std of uint8 images (dataset.cpp).
void channel_mean_std(const Tensor& images, std::vector<float>& mean, std::vector<float>& std);
}  // namespace detail

namespace {

constexpr int64_t kS = kSynthetic3dSide, kK = kSynthetic3dLandmarks;
constexpr double kMargin = 4;       // landmarks at least this far from the borders
constexpr double kMinApart = 9;     // and this far from each other

// Blob k: per-axis sigmas (z, y, x) in voxels and peak brightness over the background.
struct Blob {
  double sigma[3];
  double peak;
};
constexpr Blob kBlobs[kK] = {{{1.5, 1.5, 1.5}, 220},   // small, bright
                             {{2.6, 2.6, 2.6}, 110},   // large, dim
                             {{3.0, 1.3, 1.3}, 180},   // long along z
                             {{1.3, 1.3, 3.0}, 180}};  // long along x

ImageDataset generate(int64_t n, uint64_t stream_seed, const std::string& name, const HeatmapSpec& heatmap) {
  std::mt19937_64 rng(stream_seed);
  ImageDataset ds;
  ds.name = name;
  ds.num_classes = static_cast<int>(kK);
  ds.heatmap = heatmap;
  ds.images = Tensor::empty(Shape{n, 1, kS, kS, kS}, DType::U8);
  ds.landmarks = Tensor::empty(Shape{n, kK, 3}, DType::F32);
  std::vector<double> vol(static_cast<size_t>(kS * kS * kS));
  for (int64_t i = 0; i < n; ++i) {
    double pos[kK][3];
    for (int64_t k = 0; k < kK; ++k) {
      // Rejection sampling: far enough from the landmarks already placed.
      for (int tries = 0;; ++tries) {
        for (double& c : pos[k]) c = kMargin + uniform01(rng) * (kS - 1 - 2 * kMargin);
        bool apart = true;
        for (int64_t j = 0; j < k && apart; ++j) {
          double d2 = 0;
          for (int a = 0; a < 3; ++a) d2 += (pos[k][a] - pos[j][a]) * (pos[k][a] - pos[j][a]);
          apart = d2 >= kMinApart * kMinApart;
        }
        if (apart || tries > 1000) break;
      }
      for (int a = 0; a < 3; ++a) ds.landmarks.f32()[(i * kK + k) * 3 + a] = static_cast<float>(pos[k][a]);
    }
    // Background noise (a sum of four uniforms: near-Gaussian, mean 30, sd ~ 10 grey levels).
    for (double& v : vol) {
      const uint64_t r = rng();
      const double u4 = static_cast<double>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
      v = 30.0 + (u4 / 65535.0 - 2.0) * 17.0;
    }
    for (int64_t k = 0; k < kK; ++k) {
      const Blob& b = kBlobs[k];
      const double amp = b.peak * (0.85 + 0.3 * uniform01(rng));
      for (int64_t z = 0; z < kS; ++z)
        for (int64_t y = 0; y < kS; ++y)
          for (int64_t x = 0; x < kS; ++x) {
            const double dz = (z - pos[k][0]) / b.sigma[0], dy = (y - pos[k][1]) / b.sigma[1],
                         dx = (x - pos[k][2]) / b.sigma[2];
            const double q = dz * dz + dy * dy + dx * dx;
            if (q < 36) vol[(z * kS + y) * kS + x] += amp * std::exp(-0.5 * q);
          }
    }
    uint8_t* out = ds.images.data<uint8_t>() + i * kS * kS * kS;
    for (int64_t v = 0; v < kS * kS * kS; ++v)
      out[v] = static_cast<uint8_t>(std::clamp(std::floor(vol[v] + 0.5), 0.0, 255.0));
  }
  return ds;
}

// channel_mean_std wants (N, C, H, W): the volume's depth folds into H.
void mean_std(const ImageDataset& ds, std::vector<float>& mean, std::vector<float>& std) {
  const Tensor flat = ds.images.view(Shape{ds.images.size(0), 1, kS * kS, kS});
  detail::channel_mean_std(flat, mean, std);
}

}  // namespace

TrainTest make_synthetic3d(int64_t n_train, uint64_t seed, const HeatmapSpec& heatmap) {
  FANOUT_USER_CHECK(n_train >= 1) << "synthetic3d: needs at least 1 training volume, got " << n_train;
  TrainTest tt;
  tt.train = generate(n_train, splitmix64(seed ^ 0x3D3D3D3D3D3D3D3Dull), "synthetic3d/train", heatmap);
  tt.test = generate(std::max<int64_t>(n_train / 5, 10), splitmix64(seed ^ 0x7E57D47A3D3D3D3Dull), "synthetic3d/test", heatmap);
  mean_std(tt.train, tt.train.mean, tt.train.std);
  tt.test.mean = tt.train.mean;
  tt.test.std = tt.train.std;
  return tt;
}

}  // namespace fanout::data
