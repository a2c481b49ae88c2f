// CPU backend of kernels/elementwise.h: vectorizable elementwise loops.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);
void scale(Context& ctx, float alpha, Tensor& x);

}  // namespace fanout::kernels::cpu
