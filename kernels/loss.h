// Softmax cross-entropy with optional label smoothing (PyTorch's
// CrossEntropyLoss, reduction = mean) with accuracy counting; mean squared
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

// What softmax_xent writes besides the mean loss; each output is optional.
struct XentOutputs {
  Tensor* row_loss = nullptr;  // (N) float32 (=): each row's loss rounded to float, for exact sums in any grouping
  Tensor* correct = nullptr;   // (1) int32 (=): rows whose argmax is the label (torch.argmax's order)
  Tensor* dlogits = nullptr;   // (N, K) (=), any floating storage, may be logits itself: the gradient below
  float scale = 1.0f;          // dlogits' factor, usually 1 / N_global
  DType round = DType::F32;    // dlogits rounded to this type before it is stored (autocast's gradient)
};

FANOUT_KERNEL_OPS(
// Softmax cross-entropy, its accuracy count and its gradient in one call that
// keeps no probabilities (each row is read three times and written once):
// logits (N, K) float32, bfloat16 or float16 (read in float32), labels (N)
// int32 in [0, K) or kIgnoreLabel. loss (1) float32 (=) is the mean over the
// rows not ignored of
//   (1 - s) * (-log p[label]) + s * mean_k(-log p[k])  (NaN if all are ignored),
// p = softmax(row), summed in double; at s = 0 the loss is -log p[label]
// alone (finite beside a -inf logit, as torch's). dlogits = scale * (p - ((1 - s) * onehot
// + s / K)), 0 on ignored rows. Labels out of range throw (CPU) or are
// reported as a NaN loss and NaN gradient rows (CUDA: no host sync).
void softmax_xent(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& loss,
                  const XentOutputs& out);
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
