// Softmax cross-entropy with optional label smoothing (PyTorch's
// CrossEntropyLoss, reduction = mean), and accuracy counting; mean squared
// error (PyTorch's MSELoss) by rows, and the argmax of planes (heatmaps).
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// A label of -1 marks a row the loss ignores (torch's ignore_index, as
// nanoGPT sets it): its loss and gradient are 0 and the mean skips it.
inline constexpr int32_t kIgnoreLabel = -1;

FANOUT_KERNEL_OPS(
// logits (N, K) float32, labels (N) int32 in [0, K) or kIgnoreLabel.
// loss (1) is written (=) with the mean over the rows not ignored of
//   (1 - s) * (-log p[label]) + s * mean_k(-log p[k])  (NaN if all are ignored).
// probs (N, K) is written (=) with the softmax, kept for backward.
// row_loss (N) float32, when given, is written (=) with each row's loss
// (rounded to float), which callers sum exactly and in any grouping.
// Labels out of range throw (CPU) or are reported through the loss as NaN (CUDA).
void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& probs,
                          Tensor& loss, Tensor* row_loss = nullptr);
// dlogits (=) = scale * (probs - ((1 - s) * onehot + s / K)), 0 on ignored
// rows; scale is usually 1 / N_global.
void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float smoothing, float scale,
                           Tensor& dlogits);
// correct (1, int32) is written (=) with the number of rows whose argmax equals the label
// (first maximum wins on ties, as torch.argmax).
void count_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& correct);
// out and target (N, ...) float32 of one shape; E = numel / N values per row.
// row_loss (N) float32 (=): each row's mean of (out - target)^2, summed in
// double and rounded to float. grad (=), when given, same shape as out:
// scale * 2 / E * (out - target), the gradient of scale * sum(row_loss), so
// scale = 1 / N gives PyTorch's MSELoss (reduction = mean) over the batch.
void mse_forward(Context& ctx, const Tensor& out, const Tensor& target, float scale, Tensor& row_loss, Tensor* grad);
// x (P, S) float32: P planes of S values, S < 2^31. idx (P) int32 (=) is each
// plane's argmax in torch.argmax's order (the first NaN, else the first
// maximum), val (P) float32 (=) the value there.
void plane_argmax(Context& ctx, const Tensor& x, Tensor& idx, Tensor& val);
)

}  // namespace fanout::kernels
