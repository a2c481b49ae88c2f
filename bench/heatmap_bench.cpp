// heatmap-bench: milliseconds per volume of landmark heatmap rendering on the
// CPU (kernels/heatmap.h, without a context), the naive per-voxel loop against the separable
// vectorized renderer, and on cuda:0 (kernels/heatmap.h), for each volume
// size, landmark count and radius asked for. All write the whole (K, D, H, W)
// output (zeros included); "zero ms" is a memset of that output alone, the
// floor on the CPU. The CUDA column is the kernel alone: one launch renders a
// batch of --cuda-batch volumes, timed with CUDA events after a warm-up, median
// of --repeats launches divided by the batch; it shows "-" without a visible
// GPU or in a build without CUDA. The "same" column checks that every
// renderer gives the naive loop's bits. CPU medians of --repeats runs, one
// thread. Bad input ends with one line on stderr and a non-zero exit.
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

#ifdef FANOUT_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "apps/cli_main.h"
#include "kernels/heatmap.h"
#include "runtime/core/context.h"
#include "runtime/core/device.h"
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

#ifdef FANOUT_WITH_CUDA
void cuda_ok(cudaError_t e, const char* what) {
  FANOUT_CHECK(e == cudaSuccess) << what << ": " << cudaGetErrorName(e) << " (" << cudaGetErrorString(e) << ")";
}

// A pair of CUDA events timing the work queued between them on a stream.
class EventTimer {
 public:
  EventTimer() {
    cuda_ok(cudaEventCreate(&start_), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <class F>
  double ms(cudaStream_t s, F f) {
    cuda_ok(cudaEventRecord(start_, s), "cudaEventRecord");
    f();
    cuda_ok(cudaEventRecord(stop_, s), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float t = 0;
    cuda_ok(cudaEventElapsedTime(&t, start_, stop_), "cudaEventElapsedTime");
    return t;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};
#endif

// The CUDA column: ms per volume of kernels::render_heatmaps on cuda:0 for a
// batch of `batch` volumes whose first holds the landmarks `lm` (K, S) and
// the others random ones; `first` gets that first volume back. Negative when
// there is no CUDA.
double cuda_ms_per_volume(const Tensor& lm, const std::vector<int64_t>& vol, const data::HeatmapSpec& spec,
                          int64_t batch, int repeats, std::mt19937_64& rng, Tensor& first) {
#ifdef FANOUT_WITH_CUDA
  const int64_t k = lm.size(0), s = lm.size(1);
  Tensor lm_host = Tensor::empty(Shape{batch, k, s});
  std::memcpy(lm_host.raw(), lm.raw(), lm.nbytes());
  for (int64_t i = k * s; i < batch * k * s; ++i)
    lm_host.f32()[i] = std::uniform_real_distribution<float>(0.0f, static_cast<float>(vol[i % s]))(rng);
  const Device gpu = Device::cuda(0);
  Context ctx(gpu);
  const Tensor lm_dev = lm_host.to(gpu);
  const Shape shape = s == 3 ? Shape{batch, k, vol[0], vol[1], vol[2]} : Shape{batch, k, vol[0], vol[1]};
  Tensor out = Tensor::empty(shape, DType::F32, gpu);
  const kernels::HeatmapParams p{spec.radius, spec.sigma};
  const auto stream = static_cast<cudaStream_t>(ctx.compute().handle());
  for (int i = 0; i < 3; ++i) kernels::render_heatmaps(ctx, lm_dev, p, out);  // warm-up
  EventTimer timer;
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i)
    ms.push_back(timer.ms(stream, [&] { kernels::render_heatmaps(ctx, lm_dev, p, out); }));
  ctx.compute().synchronize();
  first = out.slice(0, 1).to(Device::cpu());
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] / static_cast<double>(batch);
#else
  (void)lm, (void)vol, (void)spec, (void)batch, (void)repeats, (void)rng, (void)first;
  return -1;
#endif
}

int run(int argc, char** argv) {
  std::string volumes_s, landmarks_s, radii_s;
  int repeats = 0, naive_repeats = 0;
  int64_t cuda_batch = 0;
  uint64_t seed = 0;
  po::options_description desc(
      "heatmap-bench: landmark heatmap rendering, naive loop vs vectorized vs CUDA (ms per volume)\n\n"
      "Usage: heatmap-bench [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("volumes", po::value(&volumes_s)->default_value("64x64x64,96x128x128"), "volume sizes, DxHxW or HxW, comma-separated")
    ("landmarks", po::value(&landmarks_s)->default_value("8,16"), "landmarks (= channels) per volume")
    ("radius", po::value(&radii_s)->default_value("6,10"), "Gaussian radii in voxels")
    ("repeats", po::value(&repeats)->default_value(21), "timed runs of the vectorized renderer (median)")
    ("naive-repeats", po::value(&naive_repeats)->default_value(3), "timed runs of the naive loop (median)")
    ("cuda-batch", po::value(&cuda_batch)->default_value(8), "volumes per CUDA launch (its time is divided by them)")
    ("seed", po::value(&seed)->default_value(0), "seed for the landmark positions");
  // clang-format on
  po::variables_map vm;
  po::store(apps::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\nExample:\n  heatmap-bench --volumes 64x64x64 --landmarks 16 --radius 8\n";
    return 0;
  }
  po::notify(vm);
  FANOUT_USER_CHECK(repeats > 0 && naive_repeats > 0) << "--repeats and --naive-repeats must be positive";
  FANOUT_USER_CHECK(cuda_batch > 0) << "--cuda-batch must be positive";
  const auto volumes = parse_volumes(volumes_s);
  const auto counts = parse_list(landmarks_s, "--landmarks");
  const auto radii = parse_list(radii_s, "--radius");

  std::printf("heatmap-bench: float32 (K, D, H, W) output written in full, one thread, median of %d (naive %d) runs\n",
              repeats, naive_repeats);
  const bool gpu = cuda_device_count() > 0;
#ifdef FANOUT_WITH_CUDA
  if (gpu) {
    std::printf("cuda ms: kernel only on cuda:0, batches of %lld volumes, CUDA events, median of %d launches\n",
                static_cast<long long>(cuda_batch), repeats);
  } else {
    std::printf("cuda ms: skipped, no CUDA device visible\n");
  }
#else
  std::printf("cuda ms: skipped, this build has no CUDA backend\n");
#endif
  std::printf("%-12s %4s %6s %10s %10s %9s %10s %9s %10s %5s\n", "volume", "K", "radius", "naive ms", "vector ms",
              "speed-up", "cuda ms", "vs vector", "zero ms", "same");
  std::mt19937_64 rng(seed);
  std::mt19937_64 cuda_rng(seed + 1);  // the CUDA batch's other volumes: the CPU rows see the same landmarks either way
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
        bool same = std::memcmp(naive.raw(), fast.raw(), fast.nbytes()) == 0;
        char cuda_col[16] = "-", ratio_col[16] = "-";
        if (gpu) {
          Tensor first;
          const double cuda_ms = cuda_ms_per_volume(lm, vol, spec, cuda_batch, repeats, cuda_rng, first);
          same = same && std::memcmp(naive.raw(), first.raw(), naive.nbytes()) == 0;
          std::snprintf(cuda_col, sizeof cuda_col, "%.4f", cuda_ms);
          std::snprintf(ratio_col, sizeof ratio_col, "%.0fx", fast_ms / cuda_ms);
        }
        const double zero_ms = median_ms(repeats, [&] { std::memset(naive.raw(), 0, naive.nbytes()); });
        std::printf("%-12s %4lld %6lld %10.3f %10.3f %8.1fx %10s %9s %10.3f %5s\n", volume_text(vol).c_str(),
                    static_cast<long long>(k), static_cast<long long>(r), naive_ms, fast_ms, naive_ms / fast_ms,
                    cuda_col, ratio_col, zero_ms, same ? "yes" : "NO");
        std::fflush(stdout);
        FANOUT_USER_CHECK(same) << "the renderers' outputs differ (a bug)";
      }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("heatmap-bench", [&] { return run(argc, argv); });
}
