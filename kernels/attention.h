// Causal scaled-dot-product attention (one head's softmax(scale * Q K^T) V
// with key j visible to query i when j <= i), forward and backward. Forward
// keeps each query row's log-sum-exp of its scaled scores (lse, float32,
// natural log); backward returns dq, dk, dv.
// CPU: kernels/cpu/attention.cpp, the FlashAttention way (never a whole
// T x T matrix), in float32: bfloat16 and float16 operands are staged
// (kernels/staging.h) and the outputs rounded to their type once.
// CUDA: q, k, v, y, dy, dq, dk, dv are all float32, or all bfloat16, or all
// float16; lse is float32 always.
//  - float32: kernels/cuda/attention.cu, unfused: the (B*H, T, T) scores
//    through cuBLAS strided batched GEMMs and the CUDA softmax kernels, the
//    T x T matrices in the context's workspace (O(B*H*T^2) scratch).
//  - bfloat16 / float16: cuDNN's fused flash attention
//    (kernels/cuda/attention_cudnn.cu: the SDPA operation graph through the
//    cuDNN 9 backend API; forward saves cuDNN's softmax statistics, which are
//    this lse, and backward reads them with y), one plan per shape, built
//    once and cached. Where cuDNN answers NOT_SUPPORTED for a shape (or
//    FANOUT_ATTENTION_CUDNN=0) that shape falls back, logged once, to the
//    widened path: operands widened to float32, the float32 path above, the
//    results narrowed back (round to nearest even). Any other cuDNN error
//    throws. attention_last_path() tells which path a call took.
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
// Attention over a key-value cache (generation, no backward): q (B, H, Tq, D)
// holds the queries at positions [n - Tq, n) of a sequence whose keys and
// values at positions [0, n) are rows [0, n) of k and v (B, H, Tk, D),
// 1 <= Tq <= n <= Tk; y (B, H, Tq, D) (=) softmax(scale * q k^T) v with
// query i seeing keys j <= n - Tq + i. One block of threads (CUDA) or one
// work item (CPU) per query row; scores, their sum and y's sums in float64
// on the CPU, y's sums in float64 on CUDA.
void attention_decode(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n, float scale,
                      Tensor& y);
)

// Which implementation the calling thread's last attention_forward or
// attention_backward (pass) ran, for tests and logs:
//   "cpu"           kernels/cpu/attention.cpp
//   "cuda-float32"  the CUDA float32 path (cuBLAS and the softmax kernels)
//   "cudnn-fused"   cuDNN's fused flash attention (bfloat16 / float16)
//   "cuda-widened"  bfloat16 / float16 widened to the float32 path (cuDNN
//                   refused the shape, an operand is not 16-byte aligned,
//                   or FANOUT_ATTENTION_CUDNN=0)
// nullptr before the thread's first call of that pass.
enum class AttentionPass { Forward, Backward };
const char* attention_last_path(AttentionPass pass);

namespace detail {
// Backends record the path they took (a string literal) here.
void note_attention_path(AttentionPass pass, const char* path);
}  // namespace detail

}  // namespace fanout::kernels
