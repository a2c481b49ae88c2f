// image_tool: decodes image files with fanout's codec for image_reference.py.
//   image_tool decode FILE [MIN_SIDE]   "W H\n" then W*H*3 bytes of RGB on stdout
//   image_tool size FILE                "W H\n" from the header alone
// A decoding error is its one line on stderr and exit status 1.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/image_codec.h"

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
