// LayerNorm layer.
#include "models/layers/layernorm.h"

#include <cmath>

#include "kernels/layernorm.h"
#include "runtime/core/error.h"

namespace fanout::models {

LayerNorm::LayerNorm(const Shape& normalized_shape, float eps, bool elementwise_affine, bool bias)
    : shape_(normalized_shape), eps_(eps), affine_(elementwise_affine), bias_(elementwise_affine && bias),
      scale_(shape_, nullptr, nullptr) {
  FANOUT_USER_CHECK(shape_.ndim >= 1 && shape_.ndim < Shape::kMaxDims && shape_.numel() >= 1)
      << "LayerNorm: normalized_shape " << shape_.str() << " must have 1 to " << Shape::kMaxDims - 1
      << " positive dimensions";
  for (int i = 0; i < shape_.ndim; ++i)
    FANOUT_USER_CHECK(shape_[i] >= 1) << "LayerNorm: normalized_shape " << shape_.str() << " has an empty dimension";
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << "LayerNorm: eps must be non-negative, got " << eps;
  if (affine_) {
    Parameter& w = register_parameter("weight", shape_);
    Parameter* b = bias_ ? &register_parameter("bias", shape_) : nullptr;
    scale_ = NormAffine(shape_, &w, b);
  }
}

void LayerNorm::reset_parameters(std::mt19937_64&) { scale_.reset(); }

Tensor LayerNorm::forward(const Tensor& x, Context& ctx) {
  bool fits = x.dim() > shape_.ndim;
  for (int i = 0; fits && i < shape_.ndim; ++i) fits = x.size(x.dim() - shape_.ndim + i) == shape_[i];
  FANOUT_USER_CHECK(fits) << "LayerNorm" << shape_.str() << " cannot take input of shape " << x.shape().str()
                          << " (its last dims must be " << shape_.str() << ", after a batch dim)";
  x_ = x;
  const int64_t rows = x.numel() / shape_.numel();
  ensure(y_, x.shape(), ctx);
  ensure(mean_, Shape{rows}, ctx);
  ensure(rstd_, Shape{rows}, ctx);
  kernels::layer_norm_forward(ctx, x, scale_.gamma(ctx), scale_.beta(ctx), eps_, y_, mean_, rstd_);
  return y_;
}

Tensor LayerNorm::backward(const Tensor& dy, Context& ctx) {
  if (!affine_ && !input_grad()) return Tensor();  // nothing to compute
  // The parameter gradients (+=) first.
  Tensor dx = norm_input_grad(input_grad(), x_, dy, dx_, ctx);
  const NormAffine::Grads g = scale_.grads(ctx);
  kernels::layer_norm_backward(ctx, x_, dy, scale_.gamma(ctx), mean_, rstd_, dx, g.dgamma, g.dbeta);
  if (affine_) notify_grads_ready(ctx);
  if (!input_grad()) return Tensor();
  return dx;
}

}  // namespace fanout::models
