// Public loss entry points: shape/dtype/device checks, then dispatch.
#include "kernels/loss.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

void softmax_xent(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& loss,
                  const XentOutputs& out) {
  const char* op = "softmax_xent";
  detail::check_storage(ctx, op, "logits", logits);
  detail::check_tensor(ctx, op, "labels", labels, DType::I32);
  FANOUT_CHECK(logits.dim() == 2 && logits.size(0) >= 1 && logits.size(1) >= 1 &&
               labels.shape() == Shape{logits.size(0)})
      << op << ": logits " << logits.shape().str() << " and labels " << labels.shape().str()
      << " must be (N, K) and (N) with N, K >= 1";
  FANOUT_CHECK(smoothing >= 0.0f && smoothing <= 1.0f) << op << ": label smoothing " << smoothing
                                                       << " must be in [0, 1]";
  detail::check_tensor(ctx, op, "loss", loss);
  FANOUT_CHECK(loss.numel() == 1) << op << ": loss " << loss.shape().str() << " must hold one value";
  if (out.row_loss) {
    detail::check_tensor(ctx, op, "row_loss", *out.row_loss);
    FANOUT_CHECK(out.row_loss->shape() == Shape{logits.size(0)})
        << op << ": row_loss " << out.row_loss->shape().str() << " for " << logits.size(0) << " rows";
  }
  if (out.correct) {
    detail::check_tensor(ctx, op, "correct", *out.correct, DType::I32);
    FANOUT_CHECK(out.correct->numel() == 1) << op << ": correct " << out.correct->shape().str()
                                            << " must hold one value";
  }
  FANOUT_CHECK(out.round == DType::F32 || out.round == DType::BF16 || out.round == DType::F16)
      << op << ": dlogits cannot be rounded to " << dtype_name(out.round);
  if (out.dlogits) {
    detail::check_storage(ctx, op, "dlogits", *out.dlogits);
    FANOUT_CHECK(out.dlogits->shape() == logits.shape() && !out.dlogits->channels_last() && !logits.channels_last())
        << op << ": dlogits " << out.dlogits->shape().str() << " for logits " << logits.shape().str();
    FANOUT_CHECK(out.dlogits->raw() != logits.raw() || out.dlogits->dtype() == logits.dtype())
        << op << ": dlogits over logits must keep their type, " << dtype_name(logits.dtype());
  }
  // The backends read and write the storage natively (dlogits in logits'
  // type); otherwise they take float32 copies (widening is exact).
  if (!out.dlogits || out.dlogits->dtype() == logits.dtype())
    FANOUT_DISPATCH(ctx, softmax_xent, ctx, logits, labels, smoothing, loss, out);
  const Tensor zs = detail::staged_in(ctx, op, "logits", 0, logits);
  XentOutputs staged = out;
  Tensor ds;
  if (out.dlogits) {
    const bool over_logits = out.dlogits->raw() == logits.raw();
    ds = over_logits ? zs : detail::staged_out(ctx, op, "dlogits", 2, *out.dlogits);
    staged.dlogits = &ds;
  }
  FANOUT_CALL_BACKEND(ctx, softmax_xent, ctx, zs, labels, smoothing, loss, staged);
  if (out.dlogits) detail::unstage(ctx, ds, *out.dlogits);
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
