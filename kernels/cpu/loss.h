// CPU backend of kernels/loss.h: stable softmax cross-entropy, accuracy counting.
// Preconditions are checked by the public entry points before these are called.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cpu {

void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& probs,
                          Tensor& loss, Tensor* row_loss);
void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float smoothing, float scale,
                           Tensor& dlogits);
void count_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& correct);

}  // namespace fanout::kernels::cpu
