// Causal scaled-dot-product attention (one head's softmax(scale * Q K^T) V
// with key j visible to query i when j <= i), forward and backward. Forward
// keeps each query row's log-sum-exp of its scaled scores (lse, float32);
// backward recomputes the probabilities and returns dq, dk, dv.
// CPU: kernels/cpu/attention.cpp, the FlashAttention way (never a whole
// T x T matrix); float32 tensors only.
// CUDA: kernels/cuda/attention.cu, unfused: the (B*H, T, T) scores through
// cuBLAS strided batched GEMMs and the CUDA softmax kernels, the T x T
// matrices in the context's workspace (O(B*H*T^2) scratch). q, k, v, y, dy,
// dq, dk, dv are all float32, or all bfloat16, or all float16; lse is float32
// always. bfloat16 / float16 are NOT cuDNN's fused SDPA yet: they are widened
// to float32, run through the float32 path and the results narrowed back
// (round to nearest even) - correct, slower, more scratch.
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
