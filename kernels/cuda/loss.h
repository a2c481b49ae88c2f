// CUDA backend of kernels/loss.h. Declarations only; C++17, no CUDA headers.
// Preconditions (shapes, dtypes, devices) are checked by the public entry
// points; labels are not range-checked on the host (that would need a sync):
// out-of-range labels must make the loss NaN.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& probs,
                          Tensor& loss, Tensor* row_loss);
void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float smoothing, float scale,
                           Tensor& dlogits);
void count_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& correct);

}  // namespace fanout::kernels::cuda
