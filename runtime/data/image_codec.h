// Image files to 8-bit RGB, as torchvision's ImageFolder loads them
// (Pillow's Image.open(f).convert("RGB")): JPEG through libjpeg-turbo
// (accurate integer IDCT, fancy upsampling, as Pillow decodes), PNG through
// libpng. Grayscale is replicated; CMYK and YCCK JPEGs become RGB with
// Pillow's formula (Adobe's inverted CMYK undone first); palette images take
// their colours; alpha is dropped, not composited; 16-bit channels keep
// their high byte, except 16-bit grayscale PNGs, which Pillow opens as
// 32-bit integers and saturates at 255 (so do we).
//
// JPEG's DCT-domain scaling (decode_image's scale): libjpeg-turbo decodes
// at 1/2, 1/4 or 1/8 of the size directly (each side rounded up), much
// faster, as Pillow's draft mode.
//
// Every failure (not an image, truncated, corrupt) is a fanout::Error with
// one line naming `name`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fanout::data {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // height x width x 3, row-major
};

enum class ImageFormat { Unknown, Jpeg, Png };
// From the file's first bytes (magic numbers), not its name.
ImageFormat sniff_image(const uint8_t* data, size_t size);

// scale 2, 4 or 8 (JPEG only; PNGs decode whole): decode at 1/scale.
Image decode_image(const uint8_t* data, size_t size, const std::string& name, int scale = 1);
Image read_image(const std::string& path, int scale = 1);

// A JPEG's or PNG's size without decoding its pixels.
struct ImageSize {
  int width = 0, height = 0;
};
ImageSize image_size(const uint8_t* data, size_t size, const std::string& name);

}  // namespace fanout::data
