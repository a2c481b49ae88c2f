// heatmap_tool: the C++ side of the NumPy heatmap check (heatmap_reference.py).
//   heatmap_tool LANDMARKS.npy CHANNELS.npy|- C RADIUS SIGMA OUT.npy [D] H W
// LANDMARKS (K, S) or (N, K, S) float32, read with io::load_npy; CHANNELS
// (K) int32, or "-" for channel k = landmark k. Renders with render_heatmaps
// (render_heatmaps_batch for (N, K, S)) into (C, [D,] H, W) or (N, C, [D,] H, W)
// and writes it with io::save_npy.
// Exit codes: 0 ok, 1 fanout::Error (message on stderr), 2 usage.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/heatmap.h"
#include "runtime/io/npy.h"

using namespace fanout;

namespace {

int64_t parse_int(const char* s) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  FANOUT_USER_CHECK(*s && *end == '\0') << "not an integer: '" << s << "'";
  return v;
}

int run(int argc, char** argv) {
  const Tensor lm = io::load_npy(argv[1]);
  const std::string channels_path = argv[2];
  const Tensor channels = channels_path == "-" ? Tensor() : io::load_npy(channels_path);
  data::HeatmapSpec spec;
  spec.radius = static_cast<int>(parse_int(argv[4]));
  spec.sigma = std::strtod(argv[5], nullptr);
  const bool batch = lm.dim() == 3;
  Shape shape;
  if (batch) shape.d[shape.ndim++] = lm.size(0);
  shape.d[shape.ndim++] = parse_int(argv[3]);
  for (int i = 7; i < argc; ++i) shape.d[shape.ndim++] = parse_int(argv[i]);
  Tensor out = Tensor::empty(shape);
  if (batch)
    data::render_heatmaps_batch(lm, spec, out, channels);
  else
    data::render_heatmaps(lm, spec, out, channels);
  io::save_npy(argv[6], out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9 && argc != 10) {
    std::fprintf(stderr, "usage: heatmap_tool LANDMARKS.npy CHANNELS.npy|- C RADIUS SIGMA OUT.npy [D] H W\n");
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "heatmap_tool: %s\n", e.what());
    return 1;
  }
}
