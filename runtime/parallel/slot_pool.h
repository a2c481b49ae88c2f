// Memory for gradients in flight (ZeRO-2): blocks of one dtype on one
// device, first fit over chunks, a chunk of the size asked added when no
// free block fits. Passes that take and give back in the same order find
// their blocks where they were, so after the first ones a step allocates
// nothing; bytes() is what the pool holds, the in-flight share of a
// replica's gradient memory.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/core/tensor.h"

namespace fanout {

class SlotPool {
 public:
  SlotPool(DType dtype, Device device) : dtype_(dtype), device_(device) {}
  // n > 0 elements; the contents are whatever the block last held.
  Tensor take(int64_t n);
  // A block take() returned (a checked error otherwise).
  void give(const Tensor& block);
  int64_t bytes() const;
  int64_t chunks() const { return static_cast<int64_t>(chunks_.size()); }
  int64_t in_use() const { return in_use_; }  // elements taken and not given back

 private:
  struct Chunk {
    Tensor mem;
    std::vector<std::pair<int64_t, int64_t>> free;  // (offset, count), sorted, merged
  };
  DType dtype_;
  Device device_;
  std::vector<Chunk> chunks_;
  int64_t in_use_ = 0;
};

}  // namespace fanout
