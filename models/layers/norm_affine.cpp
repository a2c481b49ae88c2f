// NormAffine (see norm_affine.h).
#include "models/layers/norm_affine.h"

#include "runtime/core/error.h"

namespace fanout::models {

Tensor norm_input_grad(bool wanted, const Tensor& x, const Tensor& dy, Tensor& buf, Context& ctx) {
  if (wanted && x.dtype() == dy.dtype() && x.format() == dy.format()) return dy;
  if (wanted) ensure_like(buf, x, ctx);
  else ensure(buf, dy.shape(), ctx);
  return buf;
}

void NormAffine::reset() {
  if (!affine()) return;
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  if (b_) b_->value.fill(0.0f);
}

void NormAffine::ensure_identity(Context& ctx) {
  if (ones_.defined() && ones_.device() == ctx.device()) return;
  ensure(ones_, shape_, ctx.device());
  ensure(zeros_, shape_, ctx.device());
  ones_.fill(1.0f, &ctx.compute());
  zeros_.zero(&ctx.compute());
}

const Tensor& NormAffine::gamma(Context& ctx) {
  if (affine()) return w_->value;
  ensure_identity(ctx);
  return ones_;
}

const Tensor& NormAffine::beta(Context& ctx) {
  if (b_) return b_->value;
  ensure_identity(ctx);
  return zeros_;
}

NormAffine::Grads NormAffine::grads(Context& ctx) {
  if (affine() && b_) return {w_->grad, b_->grad};
  // Sinks of the gradients the layer has no parameter for, zeroed (the kernel
  // adds into them), of the gradient arena's dtype.
  const DType gt = affine() ? w_->grad.dtype() : DType::F32;
  ensure(dgamma_, shape_, gt, ctx);
  ensure(dbeta_, shape_, gt, ctx);
  dbeta_.zero(&ctx.compute());
  if (affine()) return {w_->grad, dbeta_};
  dgamma_.zero(&ctx.compute());
  return {dgamma_, dbeta_};
}

}  // namespace fanout::models
