// BatchIterator: one epoch of normalized float32 batches, in a (seed, epoch)-shuffled or sequential order.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "runtime/core/error.h"
#include "runtime/data/dataset.h"

namespace fanout::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound] without modulo bias: rejects the top partial range.
// Written out because std::uniform_int_distribution differs between standard libraries.
uint64_t uniform_upto(std::mt19937_64& rng, uint64_t bound) {
  if (bound == UINT64_MAX) return rng();
  const uint64_t range = bound + 1;
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % range + 1) % range;  // accept r <= limit
  uint64_t r;
  do r = rng();
  while (r > limit);
  return r % range;
}

}  // namespace

BatchIterator::BatchIterator(const ImageDataset& ds, int64_t batch_size, bool shuffle, uint64_t seed, int64_t epoch,
                             bool drop_last)
    : ds_(ds), batch_(batch_size), drop_last_(drop_last) {
  FANOUT_USER_CHECK(batch_size > 0) << "batch size must be positive, got " << batch_size;
  order_.resize(static_cast<size_t>(ds.size()));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (shuffle && order_.size() > 1) {
    // Fisher-Yates with a generator seeded from (seed, epoch): the same order on every standard library.
    std::mt19937_64 rng(splitmix64(seed ^ (static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull)));
    for (size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[uniform_upto(rng, i)]);
  }
}

int64_t BatchIterator::num_batches() const {
  const int64_t n = static_cast<int64_t>(order_.size());
  return drop_last_ ? n / batch_ : (n + batch_ - 1) / batch_;
}

bool BatchIterator::next(Tensor& x, Tensor& y) {
  const int64_t n = static_cast<int64_t>(order_.size());
  const int64_t b = std::min(batch_, n - pos_);
  if (b <= 0 || (drop_last_ && b < batch_)) return false;
  const Shape s = ds_.sample_shape();  // (C, H, W)
  const int64_t per = s.numel();
  ensure(x, Shape{b, s[0], s[1], s[2]}, DType::F32, Device::cpu());  // (B, C, H, W)
  ensure(y, Shape{b}, DType::I32, Device::cpu());                   // (B)
  float* xp = x.f32();
  int32_t* yp = y.data<int32_t>();
  const int32_t* labels = ds_.labels.data<int32_t>();
  for (int64_t k = 0; k < b; ++k) {
    const int64_t i = order_[static_cast<size_t>(pos_ + k)];
    ds_.normalized(i, xp + k * per);
    yp[k] = labels[i];
  }
  pos_ += b;
  return true;
}

}  // namespace fanout::data
