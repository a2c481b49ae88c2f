// Per-sample transforms for training: torchvision's RandomCrop(padding) and
// RandomHorizontalFlip(0.5), then the dataset's normalization. The random
// draws are a hash of (seed, epoch, index), so a sample comes out the same
// whichever thread builds it and in whatever order.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/data/dataset.h"

namespace fanout::data {

struct Augment {
  int crop_padding = -1;  // < 0: no random crop; >= 0: RandomCrop((H, W), padding), zero fill like torchvision
  bool hflip = false;     // RandomHorizontalFlip(p = 0.5)
  bool any() const { return crop_padding >= 0 || hflip; }
  std::string str() const;  // the spec parse_augment reads back: "none", "flip", "crop:4", "crop:4,flip"
};

// "none", "flip", "crop" (padding 4), "crop:P", and "crop[:P]" and "flip"
// joined by a comma in either order. Anything else throws a one-line error.
Augment parse_augment(const std::string& spec);

// Writes sample `index` of ds as float32 CHW into out: crop (reading the image
// as if padded with zeros), then flip, then (x / 255 - mean[c]) / std[c]
// computed exactly as ImageDataset::normalized. Throws on an index outside the dataset.
void load_sample(const ImageDataset& ds, int64_t index, const Augment& aug, uint64_t seed, int64_t epoch, float* out);

}  // namespace fanout::data
