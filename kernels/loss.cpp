// Public loss entry points: shape/dtype/device checks, then dispatch.
#include "kernels/loss.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
// logits (N, K) float32 with N, K >= 1; labels (N) int32.
void check_logits_labels(const Context& ctx, const char* op, const char* name, const Tensor& logits,
                         const Tensor& labels) {
  detail::check_tensor(ctx, op, name, logits);
  detail::check_tensor(ctx, op, "labels", labels, DType::I32);
  FANOUT_CHECK(logits.dim() == 2 && logits.size(0) >= 1 && logits.size(1) >= 1 &&
               labels.shape() == Shape{logits.size(0)})
      << op << ": " << name << " " << logits.shape().str() << " and labels " << labels.shape().str()
      << " must be (N, K) and (N) with N, K >= 1";
}
void check_smoothing(const char* op, float s) {
  FANOUT_CHECK(s >= 0.0f && s <= 1.0f) << op << ": label smoothing " << s << " must be in [0, 1]";
}
}  // namespace

void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& probs,
                          Tensor& loss, Tensor* row_loss) {
  const char* op = "softmax_xent_forward";
  check_logits_labels(ctx, op, "logits", logits, labels);
  check_smoothing(op, smoothing);
  detail::check_tensor(ctx, op, "probs", probs);
  FANOUT_CHECK(probs.shape() == logits.shape()) << op << ": probs " << probs.shape().str() << " for logits "
                                                << logits.shape().str();
  detail::check_tensor(ctx, op, "loss", loss);
  FANOUT_CHECK(loss.numel() == 1) << op << ": loss " << loss.shape().str() << " must hold one value";
  if (row_loss) {
    detail::check_tensor(ctx, op, "row_loss", *row_loss);
    FANOUT_CHECK(row_loss->shape() == Shape{logits.size(0)})
        << op << ": row_loss " << row_loss->shape().str() << " for " << logits.size(0) << " rows";
  }
  FANOUT_DISPATCH(ctx, softmax_xent_forward, ctx, logits, labels, smoothing, probs, loss, row_loss);
}

void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float smoothing, float scale,
                           Tensor& dlogits) {
  const char* op = "softmax_xent_backward";
  check_logits_labels(ctx, op, "probs", probs, labels);
  check_smoothing(op, smoothing);
  detail::check_tensor(ctx, op, "dlogits", dlogits);
  FANOUT_CHECK(dlogits.shape() == probs.shape()) << op << ": dlogits " << dlogits.shape().str() << " for probs "
                                                 << probs.shape().str();
  FANOUT_DISPATCH(ctx, softmax_xent_backward, ctx, probs, labels, smoothing, scale, dlogits);
}

void count_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& correct) {
  const char* op = "count_correct";
  check_logits_labels(ctx, op, "logits", logits, labels);
  detail::check_tensor(ctx, op, "correct", correct, DType::I32);
  FANOUT_CHECK(correct.numel() == 1) << op << ": correct " << correct.shape().str() << " must hold one value";
  FANOUT_DISPATCH(ctx, count_correct, ctx, logits, labels, correct);
}

}  // namespace fanout::kernels
