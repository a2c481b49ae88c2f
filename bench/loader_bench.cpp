// loader-bench: images per second of the DataLoader alone (shuffled training
// set, augmentation on) for each worker count, reading every byte of every
// batch. The checksum column must agree between rows: batches do not depend on
// the worker count. Bad input ends with one line on stderr and a non-zero exit.
#include <boost/program_options.hpp>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "apps/cli_main.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/data/open_data.h"
#include "runtime/data/sampler.h"
#include "runtime/data/transforms.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

std::vector<int> parse_workers_list(const std::string& s) {
  std::vector<int> out;
  size_t begin = 0;
  while (true) {
    const size_t comma = s.find(',', begin);
    const size_t end = comma == std::string::npos ? s.size() : comma;
    int w = -1;
    const auto [p, ec] = std::from_chars(s.data() + begin, s.data() + end, w);
    FANOUT_USER_CHECK(end > begin && ec == std::errc() && p == s.data() + end && w >= 0 && w <= 256)
        << "bad --workers-list '" << s << "' (expected worker counts in 0..256 separated by commas, like 0,1,2,4)";
    out.push_back(w);
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

// A tensor's bytes (every one read) hashed by position: each 32-bit word
// mixed, then weighted by an odd multiple of its index, so that a changed,
// moved or flipped value changes the sum (a loop the compiler vectorizes).
uint64_t position_hash(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw());
  const size_t bytes = t.nbytes(), words = bytes / 4;
  uint64_t s = 0;
  for (size_t k = 0; k < words; ++k) {
    uint32_t w;
    std::memcpy(&w, p + 4 * k, 4);
    uint64_t v = (w + 1ull) * 0x9E3779B97F4A7C15ull;
    v ^= v >> 29;
    s += v * (2 * k + 1);
  }
  for (size_t k = 4 * words; k < bytes; ++k) s += (p[k] + 1ull) * 0xC2B2AE3D27D4EB4Full * (2 * k + 1);
  return s;
}

// The batch's inputs and targets, folded into an order-sensitive running hash.
uint64_t fold(uint64_t h, const Tensor& x, const Tensor& y) {
  for (uint64_t v : {position_hash(x), position_hash(y)}) {
    h = (h ^ v) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  return h;
}

int run(int argc, char** argv) {
  std::string data, workers_list, augment, normalize;
  int64_t batch_size = 32;
  int epochs = 1, prefetch = 2;
  std::string seed_text;
  bool pin_memory = false;
  po::options_description desc(
      "loader-bench: DataLoader throughput per worker count\n\n"
      "Usage: loader-bench [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("data", po::value(&data)->default_value("fashion-mnist"),
     "fashion-mnist (Debian package dataset-fashion-mnist), fashion-mnist:DIR, cifar10:DIR, synthetic[:N], "
     "imagefolder:DIR (image files, decoded by the workers), wds:DIR (WebDataset tar shards)")
    ("batch-size", po::value(&batch_size)->default_value(32), "batch size")
    ("workers-list", po::value(&workers_list)->default_value("0,1,2,4"), "worker counts to measure, one row each")
    ("augment", po::value(&augment)->default_value("crop:4,flip"),
     "none, flip, crop[:P] or crop[:P],flip; image files: random-resized-crop:S[:SMIN:SMAX] or "
     "[resize:R,]center-crop:S, and flip; jpeg-draft (JPEGs decoded smaller where the resize allows)")
    ("normalize", po::value(&normalize)->default_value("imagenet"), "image files: imagenet, none, M,S or M1,M2,M3,S1,S2,S3")
    ("epochs", po::value(&epochs)->default_value(1), "epochs per worker count")
    ("prefetch", po::value(&prefetch)->default_value(2), "batches in flight per worker")
    ("pin-memory", po::bool_switch(&pin_memory), "page-locked batch buffers (when a CUDA device is visible)")
    ("seed", po::value(&seed_text)->default_value("0"), "seed for the shuffle and the augmentation (0..2^64-1)");
  // clang-format on
  po::variables_map vm;
  po::store(apps::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\nExamples:\n  loader-bench --workers-list 0,1,2 --augment crop:4,flip\n"
              << "  loader-bench --data imagefolder:/data/photos --augment random-resized-crop:224,flip --workers-list 1,2\n";
    return 0;
  }
  po::notify(vm);
  const uint64_t seed = apps::parse_seed(seed_text);
  FANOUT_USER_CHECK(batch_size > 0) << "--batch-size must be positive, got " << batch_size;
  FANOUT_USER_CHECK(epochs > 0) << "--epochs must be positive, got " << epochs;
  FANOUT_USER_CHECK(prefetch >= 1) << "--prefetch must be at least 1, got " << prefetch;
  const std::vector<int> workers = parse_workers_list(workers_list);
  data::LoaderOptions o;
  o.batch_size = batch_size;
  o.prefetch = prefetch;
  o.pin_memory = pin_memory;
  o.augment = data::parse_augment(augment);
  o.seed = seed;

  data::DataOptions dopts;
  dopts.seed = seed;
  dopts.augment = o.augment;
  dopts.normalize = normalize;
  const data::DataSplits splits = data::open_data(data, dopts);
  if (!vm["normalize"].defaulted() && !data.starts_with("imagefolder:") && !data.starts_with("wds:"))
    std::fprintf(stderr, "loader-bench: warning: --normalize has no effect without image files (imagefolder:DIR, "
                 "wds:DIR)\n");
  const data::Dataset& ds = *splits.train;
  std::printf("loader-bench: %s, %lld samples %s, batch %lld, augment %s, prefetch %d, %d epoch(s), %u hardware threads\n",
              ds.name.c_str(), static_cast<long long>(ds.size()), ds.sample_shape().str().c_str(),
              static_cast<long long>(batch_size), o.augment.str().c_str(), prefetch, epochs,
              std::thread::hardware_concurrency());
  std::printf("%8s %12s %10s %18s\n", "workers", "images/s", "seconds", "checksum");
  for (int w : workers) {
    o.workers = w;
    data::DataLoader loader(ds, std::make_unique<data::RandomSampler>(ds.size(), seed), o);
    Tensor x, y;
    uint64_t h = 0, images = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      loader.start_epoch(e);
      while (loader.next(x, y)) {
        h = fold(h, x, y);
        images += static_cast<uint64_t>(x.size(0));
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%8d %12.0f %10.3f %18llx\n", w, s > 0 ? images / s : 0.0, s, static_cast<unsigned long long>(h));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("loader-bench", [&] { return run(argc, argv); });
}
