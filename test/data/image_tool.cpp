// image_tool: decodes image files with fanout's codec for image_reference.py.
//   image_tool decode FILE [SCALE]   "W H\n" then W*H*3 bytes of RGB on stdout
//   image_tool size FILE             "W H\n" from the header alone
//   image_tool resize FILE TOP LEFT H W OUT_H OUT_W
//                                    the box resized (Pillow's bilinear), as decode
//   image_tool region FILE TOP LEFT BOTTOM RIGHT OUT_H OUT_W
//                                    a region with fractional edges resized, as decode
//   image_tool draft FILE TOP LEFT H W OUT_H OUT_W
//                                    the loader's jpeg-draft decode and resize of the box,
//                                    as decode, and "scale D" on stderr
//   image_tool decode-seq FILE...    each file decoded in turn on one thread: a line
//                                    "ok W H FNV1A64-HEX" of its pixels or "error: MESSAGE"
// A decoding error is its one line on stderr and exit status 1.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/image_codec.h"
#include "runtime/data/image_transforms.h"

namespace {

using fanout::data::Image;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Image sized(int height, int width) {
  Image im;
  im.height = height;
  im.width = width;
  im.rgb.resize(static_cast<size_t>(height) * width * 3);
  return im;
}

int write_image(const Image& im) {
  std::printf("%d %d\n", im.width, im.height);
  std::fflush(stdout);
  std::fwrite(im.rgb.data(), 1, im.rgb.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: image_tool decode FILE [SCALE] | size FILE | resize|region|draft FILE A B C D OH OW\n");
    return 2;
  }
  const std::string cmd = argv[1], path = argv[2];
  if (cmd == "decode-seq") {
    for (int i = 2; i < argc; ++i) try {
        const Image im = fanout::data::read_image(argv[i]);
        uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
        for (uint8_t b : im.rgb) h = (h ^ b) * 1099511628211ull;
        std::printf("ok %d %d %016llx\n", im.width, im.height, static_cast<unsigned long long>(h));
      } catch (const fanout::Error& e) {
        std::printf("error: %s\n", e.what());
      }
    return 0;
  }
  auto arg = [&](int i) { return std::atoi(argv[i]); };
  try {
    if (cmd == "size") {
      const auto bytes = read_bytes(path);
      const auto s = fanout::data::image_size(bytes.data(), bytes.size(), path);
      std::printf("%d %d\n", s.width, s.height);
      return 0;
    }
    if (cmd == "resize" && argc == 9) {
      const auto src = fanout::data::read_image(path);
      Image out = sized(arg(7), arg(8));
      fanout::data::resize_bilinear(src, {arg(3), arg(4), arg(5), arg(6)}, out.height, out.width, out.rgb.data());
      return write_image(out);
    }
    if (cmd == "region" && argc == 9) {
      const auto src = fanout::data::read_image(path);
      Image out = sized(arg(7), arg(8));
      const fanout::data::Region r{std::atof(argv[3]), std::atof(argv[4]), std::atof(argv[5]), std::atof(argv[6])};
      fanout::data::resize_region(src, r, out.height, out.width, out.rgb.data());
      return write_image(out);
    }
    if (cmd == "draft" && argc == 9) {
      const auto bytes = read_bytes(path);
      const auto full = fanout::data::image_size(bytes.data(), bytes.size(), path);
      Image out = sized(arg(7), arg(8));
      const int scale = fanout::data::decode_resized(bytes.data(), bytes.size(), path, full,
                                                     {arg(3), arg(4), arg(5), arg(6)}, out.height, out.width, true,
                                                     out.rgb.data());
      std::fprintf(stderr, "scale %d\n", scale);
      return write_image(out);
    }
    return write_image(fanout::data::read_image(path, argc > 3 ? arg(3) : 1));
  } catch (const fanout::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
