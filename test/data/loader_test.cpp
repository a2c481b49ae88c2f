// DataLoader: batches in the sampler's order with the right values, drop_last
// and the partial last batch, byte-identical batches for any number of workers
// and prefetch depth, reused slot buffers, restarting and destroying mid-epoch,
// worker exceptions rethrown in order, wait_seconds() within the time spent in
// next(), and option checks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "data/pipeline_test_util.h"
#include "runtime/core/device.h"
#include "runtime/core/memory.h"
#include "runtime/data/loader.h"
#include "support/test_util.h"

namespace fanout::data {
namespace {

using namespace fanout::testing;  // random datasets and checks

constexpr int64_t kC = 2, kH = 4, kW = 5, kPer = kC * kH * kW;

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
  bool operator==(const Batch& o) const {
    return x.size() == o.x.size() && y == o.y && std::memcmp(x.data(), o.x.data(), x.size() * sizeof(float)) == 0;
  }
};

// One epoch's batches, copied out, checking shapes, dtypes and num_batches on the way.
std::vector<Batch> read_epoch(DataLoader& dl, int64_t epoch) {
  dl.start_epoch(epoch);
  std::vector<Batch> out;
  Tensor x, y;
  while (dl.next(x, y)) {
    const int64_t b = x.size(0);
    EXPECT_EQ(x.shape(), (Shape{b, kC, kH, kW}));
    EXPECT_EQ(x.dtype(), DType::F32);
    EXPECT_TRUE(x.device().is_cpu());
    EXPECT_EQ(y.shape(), (Shape{b}));
    EXPECT_EQ(y.dtype(), DType::I32);
    out.push_back({std::vector<float>(x.f32(), x.f32() + b * kPer),
                   std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + b)});
  }
  EXPECT_EQ(static_cast<int64_t>(out.size()), dl.num_batches());
  EXPECT_FALSE(dl.next(x, y)) << "next after the end";
  return out;
}

// The batches an epoch must yield: load_sample over `order`, cut into batches.
std::vector<Batch> expected_epoch(const ImageDataset& ds, const std::vector<int64_t>& order, int64_t batch,
                                  bool drop_last, const Augment& a, uint64_t seed, int64_t epoch) {
  std::vector<Batch> out;
  const int64_t n = static_cast<int64_t>(order.size());
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t b = std::min(batch, n - begin);
    if (drop_last && b < batch) break;
    Batch e{std::vector<float>(b * kPer), {}};
    for (int64_t k = 0; k < b; ++k) {
      load_sample(ds, order[begin + k], a, seed, epoch, e.x.data() + k * kPer);
      e.y.push_back(ds.labels.data<int32_t>()[order[begin + k]]);
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<int64_t> sizes(const std::vector<Batch>& batches) {
  std::vector<int64_t> s;
  for (const Batch& b : batches) s.push_back(static_cast<int64_t>(b.y.size()));
  return s;
}

LoaderOptions opts(int64_t batch, int workers = 0, int prefetch = 2, bool drop_last = false) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.prefetch = prefetch;
  o.drop_last = drop_last;
  return o;
}

TEST(DataLoader, SequentialOrderAndValues) {
  const ImageDataset ds = random_image_dataset(23, kC, kH, kW, 1);
  for (int workers : {0, 2}) {
    DataLoader dl(ds, std::make_unique<SequentialSampler>(23), opts(5, workers));
    EXPECT_EQ(dl.num_batches(), 5);
    EXPECT_EQ(dl.num_samples(), 23);
    const auto got = read_epoch(dl, 0);
    EXPECT_EQ(sizes(got), (std::vector<int64_t>{5, 5, 5, 5, 3}));
    EXPECT_TRUE(got == expected_epoch(ds, iota(23), 5, false, Augment{}, 0, 0)) << workers << " workers";
  }
}

TEST(DataLoader, FollowsTheRandomSamplersOrder) {
  const ImageDataset ds = random_image_dataset(50, kC, kH, kW, 2);
  DataLoader dl(ds, std::make_unique<RandomSampler>(50, 17), opts(8, 2));
  for (int64_t epoch : {0, 1, 5}) {
    const auto got = read_epoch(dl, epoch);
    EXPECT_EQ(sizes(got), (std::vector<int64_t>{8, 8, 8, 8, 8, 8, 2}));
    EXPECT_TRUE(got == expected_epoch(ds, shuffled_indices(50, 17, epoch), 8, false, Augment{}, 0, epoch))
        << "epoch " << epoch;
  }
}

TEST(DataLoader, GoldenOrderAndBatchSizeDoesNotChangeIt) {
  // RandomSampler's pinned order (see RandomSampler.GoldenOrder) reaches the batches unchanged.
  ImageDataset ds = random_image_dataset(10, kC, kH, kW, 12);
  for (int32_t i = 0; i < 10; ++i) ds.labels.data<int32_t>()[i] = i;  // labels name the samples
  for (int64_t batch : {1, 4, 10, 50}) {
    DataLoader dl(ds, std::make_unique<RandomSampler>(10, 1234), opts(batch, 2));
    std::vector<int32_t> order;
    for (const Batch& b : read_epoch(dl, 2)) order.insert(order.end(), b.y.begin(), b.y.end());
    EXPECT_EQ(order, (std::vector<int32_t>{9, 5, 8, 3, 2, 1, 6, 7, 0, 4})) << "batch " << batch;
  }
}

TEST(DataLoader, DropLast) {
  const ImageDataset ds = random_image_dataset(23, kC, kH, kW, 3);
  DataLoader dl(ds, std::make_unique<RandomSampler>(23, 3), opts(5, 1, 2, /*drop_last=*/true));
  EXPECT_EQ(dl.num_batches(), 4);
  EXPECT_EQ(dl.num_samples(), 20);
  const auto got = read_epoch(dl, 1);
  EXPECT_EQ(sizes(got), (std::vector<int64_t>{5, 5, 5, 5}));
  // The 20 it yields are the first 20 of the same epoch without drop_last.
  DataLoader full(ds, std::make_unique<RandomSampler>(23, 3), opts(5, 1));
  auto all = read_epoch(full, 1);
  all.pop_back();
  EXPECT_TRUE(got == all);
  // Exact multiple: nothing dropped. A batch larger than the dataset: one partial batch, or none with drop_last.
  EXPECT_EQ(DataLoader(ds, std::make_unique<SequentialSampler>(23), opts(23, 0, 2, true)).num_batches(), 1);
  DataLoader big(ds, std::make_unique<SequentialSampler>(23), opts(100, 2));
  EXPECT_EQ(sizes(read_epoch(big, 0)), (std::vector<int64_t>{23}));
  DataLoader big_drop(ds, std::make_unique<SequentialSampler>(23), opts(100, 2, 2, true));
  EXPECT_EQ(big_drop.num_samples(), 0);
  EXPECT_TRUE(read_epoch(big_drop, 0).empty());
}

TEST(DataLoader, SameBytesForAnyWorkersAndPrefetch) {
  // Augmentation on, so a draw that depended on the thread or call order would show.
  const ImageDataset ds = random_image_dataset(103, kC, kH, kW, 4);
  for (bool drop_last : {false, true}) {
    LoaderOptions base = opts(8, 0, 1, drop_last);
    base.augment = parse_augment("crop:2,flip");
    base.seed = 21;
    std::vector<std::vector<Batch>> ref;
    for (int64_t epoch : {0, 1}) {
      ref.push_back(expected_epoch(ds, shuffled_indices(103, 5, epoch), 8, drop_last, base.augment, 21, epoch));
      EXPECT_EQ(ref.back().size(), drop_last ? 12u : 13u);
    }
    for (int workers : {0, 1, 2, 4})
      for (int prefetch : {1, 3}) {
        LoaderOptions o = base;
        o.workers = workers;
        o.prefetch = prefetch;
        DataLoader dl(ds, std::make_unique<RandomSampler>(103, 5), o);
        for (int64_t epoch : {0, 1})
          EXPECT_TRUE(read_epoch(dl, epoch) == ref[epoch])
              << workers << " workers, prefetch " << prefetch << ", epoch " << epoch << ", drop_last " << drop_last;
      }
  }
}

TEST(DataLoader, ReusesSlotBuffersWithoutAllocating) {
  const ImageDataset ds = random_image_dataset(57, kC, kH, kW, 5);
  for (int workers : {0, 2}) {
    for (bool pin : {false, true}) {
      LoaderOptions o = opts(6, workers, 2);
      o.pin_memory = pin;
      o.augment.hflip = true;
      const uint64_t before = alloc_stats().host_allocs;
      DataLoader dl(ds, std::make_unique<RandomSampler>(57, 1), o);
      EXPECT_EQ(dl.pinned(), pin && cuda_device_count() > 0);
      const uint64_t slots = workers == 0 ? 1 : 2 * 2;
      EXPECT_EQ(alloc_stats().host_allocs - before, 2 * slots) << "an x and a y buffer per slot";
      const uint64_t allocs = alloc_stats().host_allocs;
      std::set<const void*> buffers;
      Tensor x, y;
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        dl.start_epoch(epoch);
        int64_t batches = 0;
        while (dl.next(x, y)) {
          buffers.insert(x.raw());
          ++batches;
        }
        EXPECT_EQ(batches, 10);
        EXPECT_EQ(x.size(0), 3);  // the last, partial batch in a slot of the same storage
      }
      EXPECT_EQ(alloc_stats().host_allocs, allocs) << workers << " workers, pin " << pin;
      EXPECT_LE(buffers.size(), slots);
      // Pinned or not, the bytes are the same.
      EXPECT_TRUE(read_epoch(dl, 4) == expected_epoch(ds, shuffled_indices(57, 1, 4), 6, false, o.augment, 0, 4));
    }
  }
}

TEST(DataLoader, BatchStaysValidUntilTheNextCall) {
  // Workers run ahead while the consumer holds a batch; they must not write into its slot.
  const ImageDataset ds = random_image_dataset(120, kC, kH, kW, 13);
  LoaderOptions o = opts(4, 3, 1);
  o.augment.hflip = true;
  DataLoader dl(ds, std::make_unique<RandomSampler>(120, 8), o);
  const auto expected = expected_epoch(ds, shuffled_indices(120, 8, 0), 4, false, o.augment, 0, 0);
  dl.start_epoch(0);
  Tensor x, y;
  for (size_t b = 0; dl.next(x, y); ++b) {
    if (b % 5 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the workers try
    ASSERT_EQ(std::memcmp(x.raw(), expected[b].x.data(), expected[b].x.size() * sizeof(float)), 0) << "batch " << b;
    ASSERT_EQ(std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + 4), expected[b].y) << "batch " << b;
  }
}

TEST(DataLoader, StartEpochMidEpochThenAFullEpoch) {
  const ImageDataset ds = random_image_dataset(200, kC, kH, kW, 6);
  LoaderOptions o = opts(7, 3, 2);
  o.augment = parse_augment("crop:1,flip");
  DataLoader dl(ds, std::make_unique<RandomSampler>(200, 2), o);
  Tensor x, y;
  dl.start_epoch(0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(dl.next(x, y));
  EXPECT_TRUE(read_epoch(dl, 1) == expected_epoch(ds, shuffled_indices(200, 2, 1), 7, false, o.augment, 0, 1));
  // Abandon right after starting, and restart the same epoch after a partial read.
  dl.start_epoch(2);
  dl.start_epoch(0);
  ASSERT_TRUE(dl.next(x, y));
  EXPECT_TRUE(read_epoch(dl, 0) == expected_epoch(ds, shuffled_indices(200, 2, 0), 7, false, o.augment, 0, 0));
  EXPECT_GT(dl.wait_seconds(), 0.0) << "a whole epoch's next() calls add up to some time";
  dl.start_epoch(3);
  EXPECT_EQ(dl.wait_seconds(), 0.0) << "reset by start_epoch";
}

// An epoch cut after 3 batches of 7 (21 samples) and continued from sample
// 21 in batches of 5 (a resume with another batch size): the rest comes in
// the epoch's order, re-batched, so the two parts hold every sample once;
// first_batch then counts batches of 5 from sample 21.
TEST(DataLoader, StartEpochAtASampleReBatchesTheRest) {
  ImageDataset ds = random_image_dataset(50, kC, kH, kW, 8);
  for (int32_t i = 0; i < 50; ++i) ds.labels.data<int32_t>()[i] = i;  // labels name the samples
  const std::vector<int64_t> order = shuffled_indices(50, 4, 1);
  for (int workers : {0, 2}) {
    std::vector<int32_t> seen;
    DataLoader first(ds, std::make_unique<RandomSampler>(50, 4), opts(7, workers));
    first.start_epoch(1);
    Tensor x, y;
    for (int b = 0; b < 3; ++b) {
      ASSERT_TRUE(first.next(x, y));
      seen.insert(seen.end(), y.data<int32_t>(), y.data<int32_t>() + y.numel());
    }
    DataLoader rest(ds, std::make_unique<RandomSampler>(50, 4), opts(5, workers));
    rest.start_epoch(1, 0, 21);
    EXPECT_EQ(rest.num_batches(), 6);
    EXPECT_EQ(rest.num_samples(), 29);
    std::vector<int64_t> got_sizes;
    while (rest.next(x, y)) {
      got_sizes.push_back(x.size(0));
      seen.insert(seen.end(), y.data<int32_t>(), y.data<int32_t>() + y.numel());
    }
    EXPECT_EQ(got_sizes, (std::vector<int64_t>{5, 5, 5, 5, 5, 4}));
    ASSERT_EQ(seen.size(), 50u);
    for (size_t i = 0; i < 50; ++i) EXPECT_EQ(seen[i], order[i]) << "position " << i;
    // Batch 2 of the re-batched rest: samples 31..35 of the order.
    rest.start_epoch(1, 2, 21);
    ASSERT_TRUE(rest.next(x, y));
    EXPECT_EQ(y.data<int32_t>()[0], order[31]);
    // The next epoch starts at its beginning again.
    EXPECT_EQ(sizes(read_epoch(rest, 2)), (std::vector<int64_t>{5, 5, 5, 5, 5, 5, 5, 5, 5, 5}));
    expect_user_error([&] { rest.start_epoch(1, 0, 51); }, {"cannot start epoch 2 at sample 51 of 50"});
    expect_user_error([&] { rest.start_epoch(1, -1); }, {"start_epoch: the first batch must be non-negative, got -1"});
  }
}

TEST(DataLoader, WaitSecondsIsTimeSpentInsideNext) {
  // wait_seconds() sums the time next() blocked for a batch (workers == 0: built it). Each call may add
  // at most its own duration, measured here around the call; time between calls (the consumer sleeps
  // there in epoch 1) and the call that ends the epoch add nothing. Batches of 100 augmented 3x32x32
  // samples take long enough to build that the consumer waits in epoch 0.
  const ImageDataset ds = random_image_dataset(600, 3, 32, 32, 14);
  using Clock = std::chrono::steady_clock;
  for (int workers : {0, 1, 2}) {
    SCOPED_TRACE(::testing::Message() << workers << " workers");
    LoaderOptions o = opts(100, workers, 1);
    o.augment = parse_augment("crop:4,flip");
    DataLoader dl(ds, std::make_unique<RandomSampler>(600, 3), o);
    for (int64_t epoch : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "epoch " << epoch);
      dl.start_epoch(epoch);
      EXPECT_EQ(dl.wait_seconds(), 0.0);
      double inside = 0;  // seconds the next() calls took, measured here
      double before = 0;  // wait_seconds() after the previous call
      int64_t batches = 0;
      Tensor x, y;
      for (;;) {
        const auto t0 = Clock::now();
        const bool more = dl.next(x, y);
        const double took = std::chrono::duration<double>(Clock::now() - t0).count();
        inside += took;
        const double now = dl.wait_seconds();
        EXPECT_GE(now, before) << "batch " << batches;
        // 1 ns of slack for the rounding of the sums.
        EXPECT_LE(now - before, took + 1e-9) << "batch " << batches << ": more than the call took";
        if (!more) {
          EXPECT_EQ(now, before) << "the call that ends the epoch waits for no batch";
          break;
        }
        before = now;
        ++batches;
        if (epoch == 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      EXPECT_EQ(batches, 6);
      EXPECT_GT(dl.wait_seconds(), 0.0);
      EXPECT_LE(dl.wait_seconds(), inside + 1e-9 * static_cast<double>(batches + 1));
    }
  }
}

TEST(DataLoader, DestructionMidEpochDoesNotHang) {
  // Big enough batches that the workers are still building when the loader goes.
  const ImageDataset ds = random_image_dataset(3000, 3, 32, 32, 7);
  LoaderOptions o = opts(512, 3, 2);
  o.augment = parse_augment("crop:4,flip");
  Tensor x, y;
  {
    DataLoader dl(ds, std::make_unique<RandomSampler>(3000, 1), o);
    dl.start_epoch(0);
    ASSERT_TRUE(dl.next(x, y));
  }
  {
    DataLoader dl(ds, std::make_unique<RandomSampler>(3000, 1), o);
    dl.start_epoch(0);  // destroyed before any next()
  }
  { DataLoader dl(ds, std::make_unique<RandomSampler>(3000, 1), o); }  // never started
}

// Returns 0..n-1 but with an index past the dataset at position `bad`.
class BadSampler : public Sampler {
 public:
  BadSampler(int64_t n, int64_t bad) : n_(n), bad_(bad) {}
  void set_epoch(int64_t) override {}
  std::vector<int64_t> indices() const override {
    auto v = iota(n_);
    v[bad_] = n_ + 5;
    return v;
  }
  int64_t size() const override { return n_; }

 private:
  int64_t n_, bad_;
};

TEST(DataLoader, WorkerExceptionIsRethrownInOrder) {
  const ImageDataset ds = random_image_dataset(30, kC, kH, kW, 8);
  const auto good = expected_epoch(ds, iota(30), 4, false, Augment{}, 0, 0);
  for (int workers : {0, 1, 3}) {
    SCOPED_TRACE(::testing::Message() << workers << " workers");
    DataLoader dl(ds, std::make_unique<BadSampler>(30, 13), opts(4, workers, 2));  // batch 3 holds position 13
    for (int rep = 0; rep < 2; ++rep) {
      dl.start_epoch(rep);
      Tensor x, y;
      for (int b = 0; b < 3; ++b) {
        ASSERT_TRUE(dl.next(x, y));
        EXPECT_EQ(std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + 4), good[b].y);
      }
      expect_user_error([&] { dl.next(x, y); }, {"sample index 35 is out of range for dataset 'random' with 30"});
      // The failed batch is skipped; the rest of the epoch follows.
      int64_t after = 0;
      while (dl.next(x, y)) {
        EXPECT_EQ(std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + x.size(0)), good[4 + after].y);
        ++after;
      }
      EXPECT_EQ(after, 4);
    }
  }
}

TEST(DataLoader, DistributedSamplerShare) {
  const ImageDataset ds = random_image_dataset(23, kC, kH, kW, 9);
  DataLoader dl(ds, std::make_unique<DistributedSampler>(23, 4, 3, true, 6), opts(4, 2));
  EXPECT_EQ(dl.num_samples(), 6);
  EXPECT_EQ(dl.num_batches(), 2);
  DistributedSampler s(23, 4, 3, true, 6);
  s.set_epoch(2);
  EXPECT_TRUE(read_epoch(dl, 2) == expected_epoch(ds, s.indices(), 4, false, Augment{}, 0, 2));
}

TEST(DataLoader, EmptyDataset) {
  const ImageDataset ds = random_image_dataset(0, kC, kH, kW, 10);
  for (int workers : {0, 2}) {
    DataLoader dl(ds, std::make_unique<RandomSampler>(0, 1), opts(4, workers));
    EXPECT_EQ(dl.num_batches(), 0);
    EXPECT_TRUE(read_epoch(dl, 0).empty());
  }
}

TEST(DataLoader, BadOptions) {
  const ImageDataset ds = random_image_dataset(5, kC, kH, kW, 11);
  auto make = [&](const LoaderOptions& o) { DataLoader(ds, std::make_unique<SequentialSampler>(5), o); };
  expect_user_error([&] { make(opts(0)); }, {"batch size must be positive, got 0"});
  expect_user_error([&] { make(opts(-4)); }, {"batch size must be positive, got -4"});
  expect_user_error([&] { make(opts(4, -1)); }, {"loader workers must be in 0..256, got -1"});
  expect_user_error([&] { make(opts(4, 100000)); }, {"loader workers must be in 0..256, got 100000"});
  expect_user_error([&] { make(opts(4, 2, 0)); }, {"loader prefetch must be in 1..64 batches per worker, got 0"});
  expect_user_error([&] { make(opts(4, 2, 65)); }, {"loader prefetch must be in 1..64 batches per worker, got 65"});
  expect_user_error([&] { DataLoader(ds, nullptr, opts(4)); }, {"DataLoader needs a sampler"});
  ImageDataset short_labels = ds;
  short_labels.labels = ds.labels.slice(0, 3);
  expect_user_error([&] { DataLoader(short_labels, std::make_unique<SequentialSampler>(3), opts(4)); },
                    {"dataset 'random' has 5 images but 3 labels"});
  ImageDataset no_labels = ds;
  no_labels.labels = Tensor();
  expect_user_error([&] { DataLoader(no_labels, std::make_unique<SequentialSampler>(5), opts(4)); },
                    {"has no (N) int32 labels"});
  DataLoader dl(ds, std::make_unique<SequentialSampler>(5), opts(4, 1));
  Tensor x, y;
  expect_user_error([&] { dl.next(x, y); }, {"DataLoader::next() called before start_epoch()"});
}

}  // namespace
}  // namespace fanout::data
