// Datasets: what the DataLoader batches (Dataset), in-memory tensors of any
// shape (TensorDataset), and images (N, C, H, W) or volumes (N, C, D, H, W)
// with the per-channel mean and std used to normalize them and per sample
// either a class label or landmarks whose heatmaps are the (dense) target
// (ImageDataset). Readers: IDX (MNIST / Fashion-MNIST, gzip'd or raw),
// CIFAR-10 binary, seeded synthetic sets that a small network can learn, and
// keypoint volumes (keypoints.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/data/heatmap.h"

namespace fanout::data {

struct Augment;
class Sampler;

// Targets: class indices, int32 of target_shape() (() one per sample, (T)
// one per position of a sequence; for cross-entropy), or dense float32
// values of target_shape() (for mse).
enum class TargetKind { ClassIndex, Dense };

// What one epoch's draw of a sample depends on: augmenting datasets seed
// their random crops and flips with (seed, epoch, index); the rest ignore it.
struct SampleDraw {
  const Augment* augment = nullptr;  // null or none: no augmentation
  uint64_t seed = 0;
  int64_t epoch = 0;
};

// The interface the DataLoader drives (with its workers, pinned buffers and
// deterministic order): sample i is input_dtype() of sample_shape() (float32
// values, or int32 token ids); its target int32 class indices or float32
// values of target_shape(). get() runs on the loader's worker threads at
// once, so it must only read the dataset.
class Dataset {
 public:
  virtual ~Dataset() = default;
  std::string name;  // for messages: "fashion-mnist/train", ...
  virtual int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;
  virtual TargetKind target_kind() const = 0;
  // A dense target's shape (a sample's; () for one value); () for class indices.
  virtual Shape target_shape() const = 0;
  bool dense_targets() const { return target_kind() == TargetKind::Dense; }
  // F32 or I32 (token ids).
  virtual DType input_dtype() const { return DType::F32; }
  DType target_dtype() const { return dense_targets() ? DType::F32 : DType::I32; }
  // Writes sample i into x (sample_shape().numel() values of input_dtype())
  // and its target into y (target_shape().numel() values of target_dtype()).
  virtual void get(int64_t i, const SampleDraw& draw, void* x, void* y) const = 0;
  // One-line error when the dataset cannot serve batches with these
  // options (augmentation it cannot apply, inconsistent tensors); called
  // when a loader is built.
  virtual void check(const Augment& augment) const;
  // Samples replaced so far because their file could not be read or
  // decoded (image files with skip_bad_samples); -1: this dataset never skips.
  virtual int64_t skipped_samples() const { return -1; }
  // A training order of the dataset's own (tar shards: ShardBufferSampler)
  // for rank `rank` of `world` (drop_last: the trainer's, each rank's share
  // rounded down), or null for the trainer's default (random, or
  // DistributedSampler).
  virtual std::unique_ptr<Sampler> training_sampler(int world, int rank, uint64_t seed, bool drop_last) const;
};

// In-memory samples of any shape: inputs (N, ...) float32, passed as they
// are (normalize them first if the model wants it), or int32 token ids;
// targets (N, ...) int32 class indices (N alone: one per sample; -1 marks
// a position a sequence loss ignores), or (N, ...) float32 dense targets.
// Both on the CPU; the tensors are shared, not copied.
class TensorDataset : public Dataset {
 public:
  // One-line errors for tensors that do not fit these rules.
  TensorDataset(Tensor inputs, Tensor targets, std::string name = "tensors");
  int64_t size() const override { return inputs_.size(0); }
  Shape sample_shape() const override { return sample_; }
  TargetKind target_kind() const override { return kind_; }
  Shape target_shape() const override { return target_; }
  DType input_dtype() const override { return inputs_.dtype(); }
  void get(int64_t i, const SampleDraw& draw, void* x, void* y) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  Shape sample_, target_;
  TargetKind kind_;
};

struct ImageDataset : Dataset {
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
  // Per channel, or both empty: no normalization (uint8 scaled to [0, 1]).
  std::vector<float> mean, std;

  // Samples: rows of images that have a label (or landmarks).
  int64_t size() const override {
    if (!images.defined()) return 0;
    const Tensor& t = landmarks.defined() ? landmarks : labels;
    return t.defined() ? std::min(images.size(0), t.size(0)) : 0;
  }
  Shape sample_shape() const override;  // (C, H, W) or (C, D, H, W)
  TargetKind target_kind() const override { return landmarks.defined() ? TargetKind::Dense : TargetKind::ClassIndex; }
  // A sample's target: () for a class label, (K, spatial...) for heatmaps.
  Shape target_shape() const override;
  void get(int64_t i, const SampleDraw& draw, void* x, void* y) const override;
  void check(const Augment& augment) const override;
  // Channel c's (mean, std): the statistics', or (0, 1) without them.
  std::pair<float, float> channel_stats(int64_t c) const;
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
