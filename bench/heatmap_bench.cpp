// heatmap-bench: milliseconds per volume of landmark heatmap rendering on the
// CPU (runtime/data/heatmap.h), the naive per-voxel loop against the separable
// vectorized renderer, for each volume size, landmark count and radius asked
// for. Both write the whole (K, D, H, W) output (zeros included); "zero ms"
// is a memset of that output alone, the floor for either. The "same" column
// checks that they give the same bits. Median of --repeats runs, one thread.
// Bad input ends with one line on stderr and a non-zero exit.
#include <boost/program_options.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "apps/cli_main.h"
#include "runtime/core/error.h"
#include "runtime/data/heatmap.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

// "a,b,c" of positive integers.
std::vector<int64_t> parse_list(const std::string& s, const char* flag, char sep = ',') {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (true) {
    const size_t cut = s.find(sep, begin);
    const size_t end = cut == std::string::npos ? s.size() : cut;
    int64_t v = -1;
    const auto [p, ec] = std::from_chars(s.data() + begin, s.data() + end, v);
    FANOUT_USER_CHECK(end > begin && ec == std::errc() && p == s.data() + end && v >= 0)
        << "bad " << flag << " '" << s << "' (expected non-negative integers separated by '" << sep << "')";
    out.push_back(v);
    if (cut == std::string::npos) return out;
    begin = cut + 1;
  }
}

// "64x64x64,96x128x128" -> volumes (D, H, W) or (H, W).
std::vector<std::vector<int64_t>> parse_volumes(const std::string& s) {
  std::vector<std::vector<int64_t>> out;
  for (size_t begin = 0; begin <= s.size();) {
    const size_t cut = std::min(s.find(',', begin), s.size());
    std::vector<int64_t> v = parse_list(s.substr(begin, cut - begin), "--volumes", 'x');
    FANOUT_USER_CHECK((v.size() == 2 || v.size() == 3) && std::all_of(v.begin(), v.end(), [](int64_t n) { return n > 0; }))
        << "bad --volumes '" << s << "' (expected DxHxW or HxW of positive sizes, separated by commas)";
    out.push_back(std::move(v));
    begin = cut + 1;
  }
  return out;
}

std::string volume_text(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t n : v) s += (s.empty() ? "" : "x") + std::to_string(n);
  return s;
}

template <class F>
double median_ms(int repeats, F f) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int run(int argc, char** argv) {
  std::string volumes_s, landmarks_s, radii_s;
  int repeats = 0, naive_repeats = 0;
  uint64_t seed = 0;
  po::options_description desc(
      "heatmap-bench: landmark heatmap rendering, naive loop vs vectorized (ms per volume)\n\n"
      "Usage: heatmap-bench [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("volumes", po::value(&volumes_s)->default_value("64x64x64,96x128x128"), "volume sizes, DxHxW or HxW, comma-separated")
    ("landmarks", po::value(&landmarks_s)->default_value("8,16"), "landmarks (= channels) per volume")
    ("radius", po::value(&radii_s)->default_value("6,10"), "Gaussian radii in voxels")
    ("repeats", po::value(&repeats)->default_value(21), "timed runs of the vectorized renderer (median)")
    ("naive-repeats", po::value(&naive_repeats)->default_value(3), "timed runs of the naive loop (median)")
    ("seed", po::value(&seed)->default_value(0), "seed for the landmark positions");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\nExample:\n  heatmap-bench --volumes 64x64x64 --landmarks 16 --radius 8\n";
    return 0;
  }
  po::notify(vm);
  FANOUT_USER_CHECK(repeats > 0 && naive_repeats > 0) << "--repeats and --naive-repeats must be positive";
  const auto volumes = parse_volumes(volumes_s);
  const auto counts = parse_list(landmarks_s, "--landmarks");
  const auto radii = parse_list(radii_s, "--radius");

  std::printf("heatmap-bench: float32 (K, D, H, W) output written in full, one thread, median of %d (naive %d) runs\n",
              repeats, naive_repeats);
  std::printf("%-12s %4s %6s %10s %10s %9s %10s %5s\n", "volume", "K", "radius", "naive ms", "vector ms", "speed-up",
              "zero ms", "same");
  std::mt19937_64 rng(seed);
  for (const auto& vol : volumes)
    for (int64_t k : counts)
      for (int64_t r : radii) {
        const int s = static_cast<int>(vol.size());
        Tensor lm = Tensor::empty(Shape{k, s});  // (K, S), uniform inside the volume
        for (int64_t i = 0; i < k * s; ++i)
          lm.f32()[i] = std::uniform_real_distribution<float>(0.0f, static_cast<float>(vol[i % s]))(rng);
        const Shape shape = s == 3 ? Shape{k, vol[0], vol[1], vol[2]} : Shape{k, vol[0], vol[1]};
        Tensor naive = Tensor::empty(shape), fast = Tensor::empty(shape);
        const data::HeatmapSpec spec{static_cast<int>(r), 0};
        data::render_heatmaps(lm, spec, fast);  // warm-up: pages touched
        data::render_heatmaps_naive(lm, spec, naive);
        const double naive_ms = median_ms(naive_repeats, [&] { data::render_heatmaps_naive(lm, spec, naive); });
        const double fast_ms = median_ms(repeats, [&] { data::render_heatmaps(lm, spec, fast); });
        const bool same = std::memcmp(naive.raw(), fast.raw(), fast.nbytes()) == 0;
        const double zero_ms = median_ms(repeats, [&] { std::memset(naive.raw(), 0, naive.nbytes()); });
        std::printf("%-12s %4lld %6lld %10.3f %10.3f %8.1fx %10.3f %5s\n", volume_text(vol).c_str(),
                    static_cast<long long>(k), static_cast<long long>(r), naive_ms, fast_ms, naive_ms / fast_ms, zero_ms,
                    same ? "yes" : "NO");
        std::fflush(stdout);
        FANOUT_USER_CHECK(same) << "the naive and vectorized outputs differ (a bug)";
      }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("heatmap-bench", [&] { return run(argc, argv); });
}
