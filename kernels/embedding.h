// Token embedding (torch.nn.functional.embedding): rows of a (V, E) table
// gathered by int32 ids, and the gradient's scatter-add back onto the table.
// Backward is deterministic on every backend: each id's rows are summed in
// increasing position order in double (the CPU sorts (id, position) pairs,
// CUDA sorts them with CUB's radix sort and sums each run of equal ids in one
// block per 128 columns), then added to dweight; no floating-point atomics,
// and the two backends' bits agree.
//
// Ids outside [0, V): the CPU throws one line naming the id, its flat
// position in ids and its batch row (ctx.first_row + position / ids' row
// size). CUDA does not sync the host to look (that would stall every step,
// and CUDA graphs forbid it): forward writes NaN into the output rows of bad
// ids (so the loss turns NaN, as softmax_xent does with bad labels) and
// backward skips them; token data is checked against the vocabulary on the
// host, where it is read.
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// ids (N...) int32, 1 to 4 dims; weight (V, E) float32; y (N..., E) (=) the
// rows weight[ids].
void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& weight, Tensor& y);
// dweight (V, E) += the scatter-add of dy's (N..., E) rows by id. float64
// dweight (split-invariant math, CPU): each sample's (ids.size(0)) sum per
// id is rounded to float and added exactly, so how a batch is split over
// replicas does not change the bits.
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dy, Tensor& dweight);
)

namespace detail {
// Throws the one-line error for ids[pos] = id outside [0, vocab) (both
// backends word it alike).
[[noreturn]] void embedding_bad_id(const Context& ctx, const char* op, const Tensor& ids, int64_t pos, int64_t id,
                                   int64_t vocab);
}  // namespace detail

}  // namespace fanout::kernels
