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
  // Image files (image_folder.h) only, torchvision's names:
  int resized_crop = 0;   // > 0: RandomResizedCrop(resized_crop, scale=(scale_min, scale_max), ratio=(3/4, 4/3))
  double scale_min = 0.08, scale_max = 1.0;
  int resize = 0;         // > 0: Resize(resize), the shorter side
  int center_crop = 0;    // > 0: CenterCrop(center_crop), after the resize
  // JPEGs decoded at 1/2, 1/4 or 1/8 of their size (DCT-domain scaling, as
  // Pillow's draft mode) where the region to resize keeps kDraftMargin
  // pixels per output pixel (image_transforms.h): faster, not torchvision's pixels.
  bool jpeg_draft = false;
  bool any() const { return crop_padding >= 0 || hflip || for_files(); }
  bool for_files() const { return resized_crop > 0 || resize > 0 || center_crop > 0 || jpeg_draft; }
  std::string str() const;  // the spec parse_augment reads back: "none", "flip", "crop:4", "crop:4,flip", ...
};

// Parts joined by commas, each at most once: "flip", "crop" (padding 4),
// "crop:P"; for image files "random-resized-crop:S[:SMIN:SMAX]",
// "resize:S", "center-crop:S", "jpeg-draft". "none" alone. Anything else, and
// random-resized-crop beside crop, resize or center-crop, is a one-line error.
Augment parse_augment(const std::string& spec);

// The random bits for stream s of sample `index` in `epoch`: every draw of
// the pipeline depends on (seed, epoch, index) alone.
enum class DrawStream : uint64_t { Flip = 1, CropRow = 2, CropCol = 3, ResizedCrop = 4 };
uint64_t sample_bits(uint64_t seed, int64_t epoch, int64_t index, DrawStream s);

// Writes sample `index` of ds as float32 CHW into out: crop (reading the image
// as if padded with zeros), then flip, then (x / 255 - mean[c]) / std[c]
// computed exactly as ImageDataset::normalized. Throws on an index outside the dataset.
void load_sample(const ImageDataset& ds, int64_t index, const Augment& aug, uint64_t seed, int64_t epoch, float* out);

}  // namespace fanout::data
