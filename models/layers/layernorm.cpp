// LayerNorm layer.
#include "models/layers/layernorm.h"

#include <cmath>

#include "kernels/layernorm.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

LayerNorm::LayerNorm(const Shape& normalized_shape, float eps, bool elementwise_affine)
    : shape_(normalized_shape), eps_(eps), affine_(elementwise_affine) {
  FANOUT_USER_CHECK(shape_.ndim >= 1 && shape_.ndim < Shape::kMaxDims && shape_.numel() >= 1)
      << "LayerNorm: normalized_shape " << shape_.str() << " must have 1 to " << Shape::kMaxDims - 1
      << " positive dimensions";
  for (int i = 0; i < shape_.ndim; ++i)
    FANOUT_USER_CHECK(shape_[i] >= 1) << "LayerNorm: normalized_shape " << shape_.str() << " has an empty dimension";
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << "LayerNorm: eps must be non-negative, got " << eps;
  if (affine_) {
    w_ = &register_parameter("weight", shape_);
    b_ = &register_parameter("bias", shape_);
  }
}

void LayerNorm::reset_parameters(std::mt19937_64&) {
  if (!affine_) return;
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  b_->value.fill(0.0f);
}

Tensor LayerNorm::forward(const Tensor& x, Context& ctx) {
  bool fits = x.dim() > shape_.ndim;
  for (int i = 0; fits && i < shape_.ndim; ++i) fits = x.size(x.dim() - shape_.ndim + i) == shape_[i];
  FANOUT_USER_CHECK(fits) << "LayerNorm" << shape_.str() << " cannot take input of shape " << x.shape().str()
                          << " (its last dims must be " << shape_.str() << ", after a batch dim)";
  x_ = x;
  const int64_t rows = x.numel() / shape_.numel();
  ensure(y_, x.shape(), ctx.device());
  ensure(mean_, Shape{rows}, ctx.device());
  ensure(rstd_, Shape{rows}, ctx.device());
  if (!affine_ && (!ones_.defined() || ones_.device() != ctx.device())) {
    ensure(ones_, shape_, ctx.device());
    ensure(zeros_, shape_, ctx.device());
    ones_.fill(1.0f, &ctx.compute());
    zeros_.zero(&ctx.compute());
  }
  kernels::layer_norm_forward(ctx, x, affine_ ? w_->value : ones_, affine_ ? b_->value : zeros_, eps_, y_, mean_,
                              rstd_);
  return y_;
}

Tensor LayerNorm::backward(const Tensor& dy, Context& ctx) {
  if (!affine_ && !input_grad()) return Tensor();  // nothing to compute
  // dx over dy (backward may overwrite dy); the parameter gradients (+=) first.
  Tensor dx = input_grad() ? dy : (ensure(dx_, dy.shape(), ctx.device()), dx_);
  if (affine_) {
    kernels::layer_norm_backward(ctx, x_, dy, w_->value, mean_, rstd_, dx, w_->grad, b_->grad);
    notify_grads_ready(ctx);
  } else {
    ensure(dgamma_, shape_, ctx.device());
    ensure(dbeta_, shape_, ctx.device());
    dgamma_.zero(&ctx.compute());  // the kernel adds into them
    dbeta_.zero(&ctx.compute());
    kernels::layer_norm_backward(ctx, x_, dy, ones_, mean_, rstd_, dx, dgamma_, dbeta_);
  }
  if (!input_grad()) return Tensor();
  autocast_round(ctx, dx);  // autocast: float32 output (torch's fp32 list), low-type input gradient
  return dx;
}

}  // namespace fanout::models
