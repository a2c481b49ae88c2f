// NormAffine (see norm_affine.h).
#include "models/layers/norm_affine.h"

#include "runtime/core/error.h"

namespace fanout::models {

void NormAffine::reset() {
  if (!affine()) return;
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  b_->value.fill(0.0f);
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
  if (affine()) return b_->value;
  ensure_identity(ctx);
  return zeros_;
}

NormAffine::Grads NormAffine::grads(Context& ctx) {
  if (affine()) return {w_->grad, b_->grad};
  ensure(dgamma_, shape_, ctx.device());
  ensure(dbeta_, shape_, ctx.device());
  dgamma_.zero(&ctx.compute());  // the kernel adds into them
  dbeta_.zero(&ctx.compute());
  return {dgamma_, dbeta_};
}

}  // namespace fanout::models
