// CPU backend of kernels/pool.h: max (with argmax), average and global average pooling.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "kernels/pool.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void maxpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y, Tensor& argmax);
void maxpool2d_backward(Context& ctx, const Tensor& dy, const Tensor& argmax, Tensor& dx);
void avgpool2d_forward(Context& ctx, const Tensor& x, const PoolGeometry& g, Tensor& y);
void avgpool2d_backward(Context& ctx, const Tensor& dy, const PoolGeometry& g, Tensor& dx);
void global_avgpool_forward(Context& ctx, const Tensor& x, Tensor& y);
void global_avgpool_backward(Context& ctx, const Tensor& dy, Tensor& dx);

}  // namespace fanout::kernels::cpu
