// In-memory datasets: images (N, C, H, W) or volumes (N, C, D, H, W) with the
// per-channel mean and std used to normalize them, and per sample either a
// class label or landmarks whose heatmaps are the (dense) target.
// Readers: IDX (MNIST / Fashion-MNIST, gzip'd or raw), CIFAR-10 binary, seeded
// synthetic sets that a small network can learn, and keypoint volumes
// (keypoints.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/data/heatmap.h"

namespace fanout::data {

struct ImageDataset {
  std::string name;             // "fashion-mnist/train", ...
  // (N, C, H, W) or (N, C, D, H, W), CPU: uint8 (mean and std on the [0, 1]
  // scale) or float32 (mean and std in the data's own units).
  Tensor images;
  Tensor labels;                // (N) int32, CPU, in [0, num_classes); or undefined with landmarks
  // Keypoint sets: (N, K, S) float32 landmark coordinates in voxels, (z, y, x)
  // or (y, x), S = the spatial dims of the images; sample i's target is the
  // (K, spatial...) heatmap they draw with `heatmap` (heatmap.h).
  Tensor landmarks;
  HeatmapSpec heatmap;
  int num_classes = 10;         // classes; for keypoint sets, the landmarks K (the model's output channels)
  std::vector<float> mean, std; // per channel

  // Samples: rows of images that have a label (or landmarks).
  int64_t size() const {
    if (!images.defined()) return 0;
    const Tensor& t = landmarks.defined() ? landmarks : labels;
    return t.defined() ? std::min(images.size(0), t.size(0)) : 0;
  }
  Shape sample_shape() const;   // (C, H, W) or (C, D, H, W)
  bool dense_targets() const { return landmarks.defined(); }
  // A sample's target: () for a class label, (K, spatial...) for heatmaps.
  Shape target_shape() const;
  // Writes sample i normalized, (x / 255 - mean[c]) / std[c] for uint8 and
  // (x - mean[c]) / std[c] for float32, as float32 into out.
  void normalized(int64_t i, float* out) const;
  // Writes sample i's heatmaps (target_shape()) into out; keypoint sets only.
  void render_target(int64_t i, float* out) const;
};

struct TrainTest {
  ImageDataset train, test;
  // What loading found worth a word without refusing the data (one line
  // each, e.g. landmarks outside their volume); the front end prints them.
  std::vector<std::string> warnings;
};

// Reads an IDX image file (magic 0x00000803) and label file (0x00000801),
// gzip'd or raw (detected by content, not name). Throws fanout::Error with a
// one-line message naming the file on a missing, unreadable, truncated or
// corrupt file, or when image and label counts differ.
ImageDataset read_idx(const std::string& images_path, const std::string& labels_path, const std::string& name);

// Fashion-MNIST from DIR holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
TrainTest load_fashion_mnist(const std::string& dir);
// Where the Debian package dataset-fashion-mnist puts the files.
std::string default_fashion_mnist_dir();

// CIFAR-10 binary version: DIR holds data_batch_1..5.bin and test_batch.bin
// (each record: 1 label byte + 3072 image bytes). Missing files, sizes that
// are not whole records, or labels >= 10 throw.
TrainTest load_cifar10(const std::string& dir);

// n_train seeded samples (3, 32, 32) in 10 classes (plus n_train / 5 test
// samples): each class has its own smooth pattern, plus noise; learnable.
TrainTest make_synthetic(int64_t n_train, uint64_t seed);

// Parses --data: "fashion-mnist", "fashion-mnist:DIR", "cifar10:DIR", "synthetic", "synthetic:N",
// "keypoints3d:DIR", "synthetic3d", "synthetic3d:N". `heatmap` is the keypoint sets' target spec.
TrainTest open_dataset(const std::string& spec, uint64_t seed, const HeatmapSpec& heatmap = {});

}  // namespace fanout::data
