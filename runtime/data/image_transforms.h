// torchvision's image transforms on decoded RGB images (image_codec.h), as
// its transforms do them on Pillow images: RandomResizedCrop's parameters,
// Resize to a shorter side, CenterCrop (zero padding when the image is
// smaller), and the antialiased bilinear resampling Pillow's resize uses
// (a triangle filter widened by the downscaling factor, separable, in
// Pillow's fixed point and pass order, so the pixels equal Pillow's).
#pragma once
#include <cstdint>
#include <random>

#include "runtime/data/image_codec.h"

namespace fanout::data {

struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// RandomResizedCrop.get_params for an image of height x width: up to ten
// draws of an area fraction uniform in [scale_min, scale_max] and a log
// aspect ratio uniform in [log ratio_min, log ratio_max], rounded half to
// even; the first box that fits, at a uniform position; else the central
// box of the nearest allowed ratio.
CropBox random_resized_crop_box(int height, int width, double scale_min, double scale_max, double ratio_min,
                                double ratio_max, std::mt19937_64& rng);

// Resize(size): the shorter side becomes `size`, the longer one
// int(size * long / short) (torchvision's truncation).
void shorter_side_size(int height, int width, int size, int& out_height, int& out_width);

// CenterCrop(size)'s box: top = round((height - size) / 2), left likewise
// (half to even); where the image is smaller, -((size - height) // 2): the
// image sits after that much zero padding, as torchvision pads it.
CropBox center_crop_box(int height, int width, int size);

// Pillow's BILINEAR resize (Pillow 13's Resample.c) of `box` of `src`
// cropped first, as torchvision's resized_crop, to out_height x out_width,
// RGB, into dst (out_height * out_width * 3). The box must lie inside the image.
void resize_bilinear(const Image& src, const CropBox& box, int out_height, int out_width, uint8_t* dst);

// Copies `box` of src into dst (box.height x box.width x 3), zeros outside the image.
void crop_padded(const Image& src, const CropBox& box, uint8_t* dst);

}  // namespace fanout::data
