// GroupNorm and InstanceNorm layers.
#include "models/layers/groupnorm.h"

#include <cmath>

#include "kernels/groupnorm.h"
#include "runtime/core/error.h"

namespace fanout::models {

GroupNorm::GroupNorm(int num_groups, int64_t num_channels, float eps)
    : groups_(num_groups), c_(num_channels), eps_(eps), scale_(Shape{num_channels}, nullptr, nullptr) {
  FANOUT_USER_CHECK(num_groups >= 1 && num_channels >= 1 && num_channels % num_groups == 0)
      << "GroupNorm(" << num_groups << ", " << num_channels << "): the channels must split evenly into the groups";
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << "GroupNorm: eps must be non-negative, got " << eps;
  Parameter& w = register_parameter("weight", Shape{num_channels});
  Parameter& b = register_parameter("bias", Shape{num_channels});
  scale_ = NormAffine(Shape{num_channels}, &w, &b);
}

void GroupNorm::reset_parameters(std::mt19937_64&) { scale_.reset(); }

Tensor GroupNorm::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() >= 2 && x.size(1) == c_)
      << "GroupNorm(" << groups_ << ", " << c_ << ") cannot take input of shape " << x.shape().str();
  x_ = x;
  ensure(y_, x.shape(), ctx);
  ensure(mean_, Shape{x.size(0), groups_}, ctx);
  ensure(rstd_, Shape{x.size(0), groups_}, ctx);
  kernels::group_norm_forward(ctx, x, scale_.gamma(ctx), scale_.beta(ctx), groups_, eps_, y_, mean_, rstd_);
  return y_;
}

Tensor GroupNorm::backward(const Tensor& dy, Context& ctx) {
  // The parameter gradients (+=) first.
  Tensor dx = norm_input_grad(input_grad(), x_, dy, dx_, ctx);
  const NormAffine::Grads g = scale_.grads(ctx);
  kernels::group_norm_backward(ctx, x_, dy, scale_.gamma(ctx), mean_, rstd_, groups_, dx, g.dgamma, g.dbeta);
  notify_grads_ready(ctx);
  if (!input_grad()) return Tensor();
  return dx;
}

InstanceNorm::InstanceNorm(int spatial_dims, int64_t num_features, float eps, bool affine)
    : dims_(spatial_dims), c_(num_features), eps_(eps), affine_(affine), scale_(Shape{num_features}, nullptr, nullptr) {
  FANOUT_USER_CHECK(spatial_dims == 2 || spatial_dims == 3)
      << "InstanceNorm takes 2 or 3 spatial dimensions, got " << spatial_dims;
  FANOUT_USER_CHECK(num_features >= 1) << type_name() << ": num_features must be positive, got " << num_features;
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << type_name() << ": eps must be non-negative, got " << eps;
  if (affine) {
    Parameter& w = register_parameter("weight", Shape{num_features});
    Parameter& b = register_parameter("bias", Shape{num_features});
    scale_ = NormAffine(Shape{num_features}, &w, &b);
  }
}

void InstanceNorm::reset_parameters(std::mt19937_64&) { scale_.reset(); }

Tensor InstanceNorm::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == dims_ + 2 && x.size(1) == c_)
      << type_name() << "(" << c_ << ") cannot take input of shape " << x.shape().str() << " (expected (N, " << c_
      << (dims_ == 2 ? ", H, W))" : ", D, H, W))");
  x_ = x;
  ensure(y_, x.shape(), ctx);
  ensure(mean_, Shape{x.size(0), c_}, ctx);
  ensure(rstd_, Shape{x.size(0), c_}, ctx);
  kernels::group_norm_forward(ctx, x, scale_.gamma(ctx), scale_.beta(ctx), static_cast<int>(c_), eps_, y_, mean_,
                              rstd_);
  return y_;
}

Tensor InstanceNorm::backward(const Tensor& dy, Context& ctx) {
  if (!affine_ && !input_grad()) return Tensor();  // nothing to compute
  Tensor dx = norm_input_grad(input_grad(), x_, dy, dx_, ctx);
  const NormAffine::Grads g = scale_.grads(ctx);
  kernels::group_norm_backward(ctx, x_, dy, scale_.gamma(ctx), mean_, rstd_, static_cast<int>(c_), dx, g.dgamma,
                               g.dbeta);
  if (affine_) notify_grads_ready(ctx);
  if (!input_grad()) return Tensor();
  return dx;
}

}  // namespace fanout::models
