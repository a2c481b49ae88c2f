// First-fit pool of gradient blocks.
#include "runtime/parallel/slot_pool.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace fanout {

Tensor SlotPool::take(int64_t n) {
  FANOUT_CHECK(n > 0) << "a gradient block of " << n << " elements";
  for (Chunk& c : chunks_)
    for (auto it = c.free.begin(); it != c.free.end(); ++it) {
      if (it->second < n) continue;
      const int64_t at = it->first;
      it->first += n;
      it->second -= n;
      if (it->second == 0) c.free.erase(it);
      in_use_ += n;
      return c.mem.flat(at, Shape{n});
    }
  chunks_.push_back({Tensor::empty(Shape{n}, dtype_, device_), {}});
  in_use_ += n;
  return chunks_.back().mem.flat(0, Shape{n});
}

void SlotPool::give(const Tensor& block) {
  const int64_t n = block.numel();
  for (Chunk& c : chunks_) {
    if (!block.same_storage(c.mem)) continue;
    const int64_t at = (static_cast<const char*>(block.raw()) - static_cast<const char*>(c.mem.raw())) /
                       static_cast<int64_t>(dtype_size(dtype_));
    FANOUT_CHECK(at >= 0 && at + n <= c.mem.numel()) << "a block outside its chunk";
    auto pos = std::lower_bound(c.free.begin(), c.free.end(), std::make_pair(at, int64_t{0}));
    FANOUT_CHECK((pos == c.free.end() || at + n <= pos->first) &&
                 (pos == c.free.begin() || std::prev(pos)->first + std::prev(pos)->second <= at))
        << "a gradient block given back twice";
    pos = c.free.insert(pos, {at, n});
    if (std::next(pos) != c.free.end() && pos->first + pos->second == std::next(pos)->first) {
      pos->second += std::next(pos)->second;
      c.free.erase(std::next(pos));
    }
    if (pos != c.free.begin() && std::prev(pos)->first + std::prev(pos)->second == pos->first) {
      std::prev(pos)->second += pos->second;
      c.free.erase(pos);
    }
    in_use_ -= n;
    return;
  }
  FANOUT_CHECK(false) << "a gradient block this pool did not give";
}

int64_t SlotPool::bytes() const {
  int64_t b = 0;
  for (const Chunk& c : chunks_) b += static_cast<int64_t>(c.mem.nbytes());
  return b;
}

}  // namespace fanout
