// 2-D convolution layer.
#include "models/layers/conv2d.h"

#include <cmath>

#include "models/layers/linear.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"
#include "models/layers/init.h"

namespace fanout::models {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias, Init init)
    : in_(in), out_(out), k_(kernel), g_{stride, padding}, init_(init) {
  FANOUT_CHECK(in > 0 && out > 0 && kernel > 0 && stride > 0 && padding >= 0) << "bad Conv2d hyper-parameters";
  w_ = &register_parameter("weight", Shape{out, in, kernel, kernel});
  if (bias) b_ = &register_parameter("bias", Shape{out});
}

std::unique_ptr<Module> Conv2d::make_like() const {
  return std::make_unique<Conv2d>(in_, out_, k_, g_.stride, g_.padding, b_ != nullptr, init_);
}

void Conv2d::reset_parameters(std::mt19937_64& rng) {
  const float fan_in = static_cast<float>(in_ * k_ * k_);
  if (init_ == Init::KaimingNormalFanOut) {
    normal_fill(w_->value, std::sqrt(2.0f / static_cast<float>(out_ * k_ * k_)), rng);
  } else {
    uniform_fill(w_->value, 1.0f / std::sqrt(fan_in), rng);
  }
  if (b_) uniform_fill(b_->value, 1.0f / std::sqrt(fan_in), rng);
}

Tensor Conv2d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 4 && x.size(1) == in_ && x.size(2) + 2 * g_.padding >= k_ &&
                    x.size(3) + 2 * g_.padding >= k_)
      << "Conv2d(" << in_ << ", " << out_ << ", kernel " << k_ << ") cannot take input of shape " << x.shape().str();
  const AutocastWeights::Cast in = autocast_.forward(ctx, x, w_->value, b_ ? &b_->value : nullptr);
  x_ = in.x;
  ensure(y_, kernels::conv2d_output_shape(x.shape(), w_->shape, g_), ctx.device());
  kernels::conv2d_forward(ctx, in.x, in.w, b_ ? &in.b : nullptr, g_, y_);
  autocast_round(ctx, y_);
  return y_;
}

Tensor Conv2d::backward(const Tensor& dy, Context& ctx) {
  Tensor* dx = nullptr;
  if (input_grad()) {
    ensure(dx_, x_.shape(), ctx.device());
    dx = &dx_;
  }
  const AutocastWeights::Sinks low = autocast_.backward_begin(ctx, w_->value, w_->grad, b_ ? &b_->grad : nullptr);
  kernels::conv2d_backward(ctx, x_, *low.w, dy, g_, dx, *low.gw, low.gb);
  autocast_.backward_end(ctx, w_->grad, b_ ? &b_->grad : nullptr, dx);
  notify_grads_ready(ctx);
  return input_grad() ? dx_ : Tensor();
}

}  // namespace fanout::models
