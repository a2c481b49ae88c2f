// torchvision's image transforms on decoded RGB images (image_codec.h), as
// its transforms do them on Pillow images: RandomResizedCrop's parameters,
// Resize to a shorter side, CenterCrop (zero padding when the image is
// smaller), and the antialiased bilinear resampling Pillow's resize uses
// (a triangle filter widened by the downscaling factor, separable, in
// Pillow's fixed point and pass order, so the pixels equal Pillow's).
#pragma once
#include <cstdint>
#include <random>
#include <string>

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

// The region [top, bottom) x [left, right) of src in fractional pixel
// coordinates resized as resize_bilinear resizes a box (a box is the region
// of its integer edges): the filter reads the pixels the region touches.
// It takes a box of the full image onto an image decoded at 1/d of its size
// (the box's edges divided by d).
struct Region {
  double top = 0, left = 0, bottom = 0, right = 0;
};
void resize_region(const Image& src, const Region& r, int out_height, int out_width, uint8_t* dst);

// Augment::jpeg_draft: the JPEG scale 1/d (d = 8, 4, 2, or 1 for none) at
// which a region of region_height x region_width full-size pixels keeps at
// least kDraftMargin pixels per output pixel on both axes. With that margin,
// DCT-domain downscaling then resizing stays within a level of full
// decoding then resizing on average, on noise, gratings and edges alike
// (test/data/image_transforms_test.cpp); single pixels at sharp edges differ
// more (the two low-pass filters are not the same).
constexpr int kDraftMargin = 3;
int jpeg_draft_scale(double region_height, double region_width, int out_height, int out_width);

// Decodes an image file's bytes (`full` its size, from image_size) and
// resizes `box` of it to out_height x out_width into dst (RGB), as
// resize_bilinear on the decoded image; with draft a JPEG decodes at the
// jpeg_draft_scale of the box and the box is resized from that image.
// Returns the scale's d (1: the full size).
int decode_resized(const uint8_t* data, size_t size, const std::string& name, const ImageSize& full,
                   const CropBox& box, int out_height, int out_width, bool draft, uint8_t* dst);

// Copies `box` of src into dst (box.height x box.width x 3), zeros outside the image.
void crop_padded(const Image& src, const CropBox& box, uint8_t* dst);

}  // namespace fanout::data
