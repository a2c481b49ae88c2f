// Image sets read from files, as torchvision's ImageFolder: DIR/train/<class>/...
// and DIR/val/<class>/... (classes sorted by name give the indices; .jpg,
// .jpeg and .png in any case, in sub-folders too; hidden files and folders
// skipped; symbolic links followed). Only the list of files is kept in
// memory: each sample is read, decoded (image_codec.h) and transformed
// (image_transforms.h) by whichever loader worker builds it, straight into
// its batch. Every random draw depends on (seed, epoch, sample) alone.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/data/transforms.h"

namespace fanout::data {

// --normalize: "imagenet" (0.485,0.456,0.406 and 0.229,0.224,0.225), "none"
// (values in [0, 1]), or "M1,M2,M3,S1,S2,S3" (per channel) or "M,S" (every
// channel). One-line errors for anything else or a std that is not positive.
void parse_normalize(const std::string& spec, std::vector<float>& mean, std::vector<float>& std);

// What opening a set of image files ("KIND:DIR") checks, in one-line
// errors: first that DIR is given and is a directory; once its layout
// is checked, that `augment` gives the model one size (random-resized-crop
// or center-crop).
void check_image_dir(const char* kind, const std::string& dir);
void check_output_size(const char* kind, const std::string& dir, const Augment& augment);

class ImageFileDataset : public Dataset {
 public:
  struct File {
    std::string path;
    int32_t label = 0;
    // A member of a tar shard: its bytes at [offset, offset + size) of path, named path:member.
    int64_t offset = 0, size = -1;  // size < 0: the whole file
    std::string member;
  };
  // `pipeline` makes every sample (3, S, S): random-resized-crop:S, or
  // center-crop:S after an optional resize; flip and random-resized-crop
  // draw only when the loader passes an augmentation (training).
  // skip_bad: a file that cannot be read or decoded is reported once (a
  // warning line on stderr) and replaced by the next good sample after it,
  // counted in skipped_samples(); otherwise it is a one-line error.
  ImageFileDataset(std::vector<File> files, std::vector<std::string> classes, Augment pipeline,
                   std::vector<float> mean, std::vector<float> std, std::string name, bool skip_bad = false);
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape sample_shape() const override { return Shape{3, side_, side_}; }
  TargetKind target_kind() const override { return TargetKind::ClassIndex; }
  Shape target_shape() const override { return Shape{}; }
  void get(int64_t i, const SampleDraw& draw, void* x, void* y) const override;
  void check(const Augment& augment) const override;
  const std::vector<std::string>& classes() const { return classes_; }
  const std::vector<File>& files() const { return files_; }
  const Augment& pipeline() const { return pipeline_; }
  int64_t skipped_samples() const override { return skip_bad_ ? skipped_.load() : -1; }
  // Samples grouped in shards read in order (tar shards, consecutive in the
  // file list): training takes ShardBufferSampler's order with this buffer.
  void set_shards(std::vector<int64_t> sizes, int64_t buffer);
  std::unique_ptr<Sampler> training_sampler(int world, int rank, uint64_t seed, bool drop_last) const override;

 private:
  // Sample i into x and its label into y; throws fanout::Error for a bad file.
  void load(int64_t i, const SampleDraw& draw, float* x, int32_t* y) const;
  std::vector<File> files_;
  std::vector<std::string> classes_;
  Augment pipeline_;
  int side_ = 0;
  std::vector<float> mean_, std_;
  bool skip_bad_ = false;
  std::vector<int64_t> shard_sizes_;
  int64_t shuffle_buffer_ = 0;
  mutable std::atomic<int64_t> skipped_{0};
  mutable std::mutex reported_mu_;
  mutable std::set<int64_t> reported_;
};

// The evaluation pipeline for a training one: the same resize and center
// crop, or for random-resized-crop:S resize int(S * 256 / 224) and
// center-crop S (torchvision's 256 and 224).
Augment eval_pipeline(const Augment& train);

struct ImageFolderSplits {
  std::shared_ptr<ImageFileDataset> train, val;
  std::vector<std::string> warnings;  // one line each, for the user
};
// "imagefolder:DIR". `augment` is the training pipeline (--augment), which
// must fix the output size; one-line errors for a missing or empty folder, a
// class folder without images, a missing val, or val classes that differ.
ImageFolderSplits open_image_folder(const std::string& dir, const Augment& augment, const std::string& normalize,
                                    bool skip_bad = false);

}  // namespace fanout::data
