// Causal scaled-dot-product attention (one head's softmax(scale * Q K^T) V
// with key j visible to query i when j <= i), forward and backward, the
// FlashAttention way: forward keeps each query row's log-sum-exp of its
// scaled scores, backward recomputes the probabilities from it and never
// holds a whole T x T matrix. Float32 in and out.
// CPU: kernels/cpu/attention.cpp. CUDA: no backend yet; the entry points
// throw kernels::no_backend on any device but the CPU.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

FANOUT_KERNEL_OPS(
// q, k, v, y (B, H, T, D); y (=) softmax(scale * q k^T, causal) v per (b, h);
// lse (B, H, T) (=) log(sum over j <= i of exp(scale * q_i . k_j)).
void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale, Tensor& y,
                       Tensor& lse);
// From forward's q, k, v, scale, y and lse and the gradient dy of y:
// dq, dk, dv (=), each of q's shape.
void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                        const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv);
)

}  // namespace fanout::kernels
