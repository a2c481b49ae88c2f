// Attention heads in and out of token rows: a layout change between a
// linear layer's (B, T, C) output, whose columns [offset, offset + H * D)
// hold H heads of D features per token, and attention's (B, H, T, D). Pure
// copies (no arithmetic), so every backend's bits agree. float32, or
// bfloat16 / float16 (2-byte elements copied as they are).
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// heads[b, h, t0 + t, d] (=) rows[b, t, offset + h * D + d] for rows (B, T, C)
// and heads (B, H, Th, D), offset + H * D <= C. t0 = -1 (the default): the
// heads hold the rows' positions, Th = T (t0 taken as 0). t0 >= 0: rows go
// to positions [t0, t0 + T) of heads at least that long (a key-value
// cache), heads' other positions untouched. t0 < -1 is refused. (The
// backends, declared alike, are called with the position t0 >= 0.)
void heads_from_rows(Context& ctx, const Tensor& rows, int64_t offset, Tensor& heads, int64_t t0 = -1);
// rows[b, t, offset + h * D + d] (=) heads[b, h, t, d]; rows' other columns untouched.
void heads_to_rows(Context& ctx, const Tensor& heads, int64_t offset, Tensor& rows);
)

}  // namespace fanout::kernels
