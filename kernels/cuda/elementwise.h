// CUDA backend of kernels/elementwise.h. Declarations only; C++17, no CUDA headers.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y);
void scale(Context& ctx, float alpha, Tensor& x);

}  // namespace fanout::kernels::cuda
