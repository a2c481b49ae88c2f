// GroupNorm and InstanceNorm layers.
#include "models/layers/groupnorm.h"

#include <cmath>

#include "kernels/groupnorm.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

GroupNorm::GroupNorm(int num_groups, int64_t num_channels, float eps) : groups_(num_groups), c_(num_channels), eps_(eps) {
  FANOUT_USER_CHECK(num_groups >= 1 && num_channels >= 1 && num_channels % num_groups == 0)
      << "GroupNorm(" << num_groups << ", " << num_channels << "): the channels must split evenly into the groups";
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << "GroupNorm: eps must be non-negative, got " << eps;
  w_ = &register_parameter("weight", Shape{num_channels});
  b_ = &register_parameter("bias", Shape{num_channels});
}

void GroupNorm::reset_parameters(std::mt19937_64&) {
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  b_->value.fill(0.0f);
}

Tensor GroupNorm::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() >= 2 && x.size(1) == c_)
      << "GroupNorm(" << groups_ << ", " << c_ << ") cannot take input of shape " << x.shape().str();
  x_ = x;
  ensure(y_, x.shape(), ctx.device());
  ensure(mean_, Shape{x.size(0), groups_}, ctx.device());
  ensure(rstd_, Shape{x.size(0), groups_}, ctx.device());
  kernels::group_norm_forward(ctx, x, w_->value, b_->value, groups_, eps_, y_, mean_, rstd_);
  return y_;
}

Tensor GroupNorm::backward(const Tensor& dy, Context& ctx) {
  // dx over dy (backward may overwrite dy); the parameter gradients (+=) first.
  Tensor dx = input_grad() ? dy : (ensure(dx_, dy.shape(), ctx.device()), dx_);
  kernels::group_norm_backward(ctx, x_, dy, w_->value, mean_, rstd_, groups_, dx, w_->grad, b_->grad);
  notify_grads_ready(ctx);
  if (!input_grad()) return Tensor();
  autocast_round(ctx, dx);  // autocast: float32 output, low-type input gradient
  return dx;
}

InstanceNorm::InstanceNorm(int spatial_dims, int64_t num_features, float eps, bool affine)
    : dims_(spatial_dims), c_(num_features), eps_(eps), affine_(affine) {
  FANOUT_USER_CHECK(spatial_dims == 2 || spatial_dims == 3)
      << "InstanceNorm takes 2 or 3 spatial dimensions, got " << spatial_dims;
  FANOUT_USER_CHECK(num_features >= 1) << type_name() << ": num_features must be positive, got " << num_features;
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << type_name() << ": eps must be non-negative, got " << eps;
  if (affine) {
    w_ = &register_parameter("weight", Shape{num_features});
    b_ = &register_parameter("bias", Shape{num_features});
  }
}

void InstanceNorm::reset_parameters(std::mt19937_64&) {
  if (!affine_) return;
  FANOUT_CHECK(w_->value.device().is_cpu()) << "initialization runs on the CPU";
  w_->value.fill(1.0f);
  b_->value.fill(0.0f);
}

Tensor InstanceNorm::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == dims_ + 2 && x.size(1) == c_)
      << type_name() << "(" << c_ << ") cannot take input of shape " << x.shape().str() << " (expected (N, " << c_
      << (dims_ == 2 ? ", H, W))" : ", D, H, W))");
  x_ = x;
  ensure(y_, x.shape(), ctx.device());
  ensure(mean_, Shape{x.size(0), c_}, ctx.device());
  ensure(rstd_, Shape{x.size(0), c_}, ctx.device());
  if (!affine_ && (!ones_.defined() || ones_.device() != ctx.device())) {
    ensure(ones_, Shape{c_}, ctx.device());
    ensure(zeros_, Shape{c_}, ctx.device());
    ones_.fill(1.0f, &ctx.compute());
    zeros_.zero(&ctx.compute());
  }
  kernels::group_norm_forward(ctx, x, affine_ ? w_->value : ones_, affine_ ? b_->value : zeros_,
                              static_cast<int>(c_), eps_, y_, mean_, rstd_);
  return y_;
}

Tensor InstanceNorm::backward(const Tensor& dy, Context& ctx) {
  if (!affine_ && !input_grad()) return Tensor();  // nothing to compute
  Tensor dx = input_grad() ? dy : (ensure(dx_, dy.shape(), ctx.device()), dx_);
  if (affine_) {
    kernels::group_norm_backward(ctx, x_, dy, w_->value, mean_, rstd_, static_cast<int>(c_), dx, w_->grad, b_->grad);
    notify_grads_ready(ctx);
  } else {
    ensure(dgamma_, Shape{c_}, ctx.device());
    ensure(dbeta_, Shape{c_}, ctx.device());
    dgamma_.zero(&ctx.compute());  // the kernel adds into them
    dbeta_.zero(&ctx.compute());
    kernels::group_norm_backward(ctx, x_, dy, ones_, mean_, rstd_, static_cast<int>(c_), dx, dgamma_, dbeta_);
  }
  if (!input_grad()) return Tensor();
  autocast_round(ctx, dx);  // autocast: float32 output, low-type input gradient
  return dx;
}

}  // namespace fanout::models
