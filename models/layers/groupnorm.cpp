// GroupNorm layer.
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

}  // namespace fanout::models
