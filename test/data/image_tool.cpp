// image_tool: decodes image files with fanout's codec for image_reference.py.
//   image_tool decode FILE [MIN_SIDE]   "W H\n" then W*H*3 bytes of RGB on stdout
//   image_tool size FILE                "W H\n" from the header alone
//   image_tool resize FILE TOP LEFT H W OUT_H OUT_W
//                                       the box resized (Pillow's bilinear), as decode
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

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: image_tool decode FILE [MIN_SIDE] | size FILE\n");
    return 2;
  }
  const std::string cmd = argv[1], path = argv[2];
  try {
    if (cmd == "size") {
      std::ifstream in(path, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto s = fanout::data::image_size(bytes.data(), bytes.size(), path);
      std::printf("%d %d\n", s.width, s.height);
      return 0;
    }
    if (cmd == "resize" && argc == 9) {
      const auto src = fanout::data::read_image(path);
      const fanout::data::CropBox box{std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6])};
      fanout::data::Image out;
      out.height = std::atoi(argv[7]);
      out.width = std::atoi(argv[8]);
      out.rgb.resize(static_cast<size_t>(out.height) * out.width * 3);
      fanout::data::resize_bilinear(src, box, out.height, out.width, out.rgb.data());
      std::printf("%d %d\n", out.width, out.height);
      std::fflush(stdout);
      std::fwrite(out.rgb.data(), 1, out.rgb.size(), stdout);
      return 0;
    }
    const auto im = fanout::data::read_image(path, argc > 3 ? std::atoi(argv[3]) : 0);
    std::printf("%d %d\n", im.width, im.height);
    std::fflush(stdout);
    std::fwrite(im.rgb.data(), 1, im.rgb.size(), stdout);
    return 0;
  } catch (const fanout::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
