// Linear layer.
#include "models/layers/linear.h"

#include <cmath>

#include "kernels/linear.h"
#include "models/layers/init.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

Linear::Linear(int64_t in, int64_t out, bool bias) : in_(in), out_(out) {
  FANOUT_CHECK(in > 0 && out > 0) << "Linear(" << in << ", " << out << ")";
  w_ = &register_parameter("weight", Shape{out, in});
  if (bias) b_ = &register_parameter("bias", Shape{out});
}

std::unique_ptr<Module> Linear::make_like() const { return std::make_unique<Linear>(in_, out_, b_ != nullptr); }

void Linear::reset_parameters(std::mt19937_64& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  uniform_fill(w_->value, bound, rng);
  if (b_) uniform_fill(b_->value, bound, rng);
}

Tensor Linear::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() >= 2 && x.size(-1) == in_)
      << "Linear(" << in_ << ", " << out_ << ") cannot take input of shape " << x.shape().str();
  in_shape_ = x.shape();
  const int64_t rows = x.numel() / in_;
  const AutocastWeights::Cast in = autocast_.forward(ctx, x.dim() == 2 ? x : x.view(Shape{rows, in_}), w_->value,
                                                     b_ ? &b_->value : nullptr, kernels::linear_rounds_in_low_type(ctx),
                                                     true);
  x_ = in.x;
  ensure_autocast_output(y_, Shape{rows, out_}, ctx);
  kernels::linear_forward(ctx, in.x, in.w, b_ ? &in.b : nullptr, y_);
  autocast_.round_output(ctx, y_);
  if (x.dim() == 2) return y_;
  Shape ys = in_shape_;
  ys[-1] = out_;
  return y_.view(ys);
}

Tensor Linear::backward(const Tensor& dy, Context& ctx) {
  Tensor* dx = nullptr;
  if (input_grad()) {
    ensure_like(dx_, x_, ctx);
    dx = &dx_;
  }
  const Tensor dy2 = dy.dim() == 2 ? dy : dy.view(Shape{x_.size(0), out_});
  const AutocastWeights::Sinks low =
      autocast_.backward_begin(ctx, dy2, w_->value, w_->grad, b_ ? &b_->grad : nullptr);
  kernels::linear_backward(ctx, x_, *low.w, low.dy, dx, *low.gw, low.gb);
  autocast_.backward_end(ctx, w_->grad, b_ ? &b_->grad : nullptr, dx);
  notify_grads_ready(ctx);
  if (!input_grad()) return Tensor();
  return in_shape_.ndim == 2 ? dx_ : dx_.view(in_shape_);
}

}  // namespace fanout::models
