// Dropout with counter-based randomness: whether element e of the sample at
// batch row r is kept is a hash of (key, r, e) alone, so a batch split over
// replicas (each with its first row's offset) draws the same mask as the
// whole batch on one device, and backward redraws the forward's mask
// instead of storing it. torch's semantics: zeroed with probability p, the
// rest scaled by 1 / (1 - p). x and y are float32, bfloat16 or float16 (one
// type, one format); e is the element's logical index in its row, so a
// channels-last tensor drops the same elements as a contiguous one.
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/splitmix.h"
#include "runtime/core/tensor.h"

#ifdef __CUDACC__
#define FANOUT_DROPOUT_HD __host__ __device__ __forceinline__
#else
#define FANOUT_DROPOUT_HD inline
#endif

namespace fanout::kernels {

namespace dropout_math {
// Whether element `e` of the sample at row `row` survives: a uniform 24-bit
// draw in [0, 1) against p.
// keep() in two parts: row_key once a row, keep_in_row for each element.
FANOUT_DROPOUT_HD uint64_t row_key(uint64_t key, int64_t row) {
  return splitmix64(key ^ splitmix64(static_cast<uint64_t>(row)));
}
FANOUT_DROPOUT_HD bool keep_in_row(uint64_t row_key, int64_t e, float p) {
  const uint64_t h = splitmix64(row_key ^ static_cast<uint64_t>(e));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f) >= p;
}
FANOUT_DROPOUT_HD bool keep(uint64_t key, int64_t row, int64_t e, float p) { return keep_in_row(row_key(key, row), e, p); }
// 1 / (1 - p), or 0 when everything is dropped.
FANOUT_DROPOUT_HD float scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }
}  // namespace dropout_math

FANOUT_KERNEL_OPS(
// y (=) x * keep(key, first_row + (i / sample) * row_stride, i % sample, p) *
// scale(p), for x (N, ...) with sample = x.numel() / N elements a row (row n
// is row first_row + n * row_stride of the whole batch: a DDP rank's rows
// are every world-th); y may be x.
// 0 <= p <= 1. Applied to dy with the forward's key and rows, it is the
// backward.
void dropout(Context& ctx, const Tensor& x, float p, uint64_t key, int64_t first_row, int64_t row_stride, Tensor& y);
)

}  // namespace fanout::kernels
