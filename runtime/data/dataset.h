// In-memory image classification datasets: uint8 images (N, C, H, W) and
// int32 labels, with the per-channel mean and std used to normalize them.
// Readers: IDX (MNIST / Fashion-MNIST, gzip'd or raw), CIFAR-10 binary, and a
// seeded synthetic set that a small network can learn.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/tensor.h"

namespace fanout::data {

struct ImageDataset {
  std::string name;             // "fashion-mnist/train", ...
  Tensor images;                // (N, C, H, W) uint8, CPU
  Tensor labels;                // (N) int32, CPU, in [0, num_classes)
  int num_classes = 10;
  std::vector<float> mean, std; // per channel, on the [0, 1] scale

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  Shape sample_shape() const;   // (C, H, W)
  // Writes sample i normalized, (x / 255 - mean[c]) / std[c], as float32 CHW into out.
  void normalized(int64_t i, float* out) const;
};

struct TrainTest {
  ImageDataset train, test;
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

// Parses --data: "fashion-mnist", "fashion-mnist:DIR", "cifar10:DIR", "synthetic", "synthetic:N".
TrainTest open_dataset(const std::string& spec, uint64_t seed);

}  // namespace fanout::data
