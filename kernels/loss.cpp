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

void mse_forward(Context& ctx, const Tensor& out, const Tensor& target, float scale, Tensor& row_loss, Tensor* grad) {
  const char* op = "mse_forward";
  detail::check_tensor(ctx, op, "out", out);
  detail::check_tensor(ctx, op, "target", target);
  detail::check_tensor(ctx, op, "row_loss", row_loss);
  FANOUT_CHECK(out.dim() >= 1 && out.size(0) >= 1 && out.numel() >= 1 && target.shape() == out.shape())
      << op << ": out " << out.shape().str() << " and target " << target.shape().str()
      << " must have one shape with at least one row";
  FANOUT_CHECK(row_loss.shape() == Shape{out.size(0)})
      << op << ": row_loss " << row_loss.shape().str() << " for " << out.size(0) << " rows";
  if (grad) {
    detail::check_tensor(ctx, op, "grad", *grad);
    FANOUT_CHECK(grad->shape() == out.shape()) << op << ": grad " << grad->shape().str() << " for out "
                                               << out.shape().str();
  }
  FANOUT_DISPATCH(ctx, mse_forward, ctx, out, target, scale, row_loss, grad);
}

void plane_argmax(Context& ctx, const Tensor& x, Tensor& idx, Tensor& val) {
  const char* op = "plane_argmax";
  detail::check_tensor(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "idx", idx, DType::I32);
  detail::check_tensor(ctx, op, "val", val);
  FANOUT_CHECK(x.dim() == 2 && x.size(1) >= 1 && x.size(1) <= INT32_MAX && idx.shape() == Shape{x.size(0)} &&
               val.shape() == Shape{x.size(0)})
      << op << ": x " << x.shape().str() << ", idx " << idx.shape().str() << " and val " << val.shape().str()
      << " must be (P, S) with 1 <= S < 2^31, (P) and (P)";
  if (x.size(0) == 0) return;
  FANOUT_DISPATCH(ctx, plane_argmax, ctx, x, idx, val);
}

}  // namespace fanout::kernels
