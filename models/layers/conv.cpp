// Convolution layers of both ranks.
#include "models/layers/conv.h"

#include <cmath>

#include "models/layers/init.h"
#include "runtime/core/error.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

ConvNd::ConvNd(int spatial, int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias,
               Init init)
    : spatial_(spatial), in_(in), out_(out), k_(kernel), g_{stride, padding}, init_(init) {
  FANOUT_CHECK(spatial == 2 || spatial == 3) << "convolution over " << spatial << " spatial axes";
  FANOUT_USER_CHECK(in > 0 && out > 0 && kernel > 0 && stride > 0 && padding >= 0)
      << "bad " << type_name() << " hyper-parameters: in " << in << ", out " << out << ", kernel " << kernel
      << ", stride " << stride << ", padding " << padding;
  Shape w{out, in, kernel, kernel};
  if (spatial == 3) w = Shape{out, in, kernel, kernel, kernel};
  w_ = &register_parameter("weight", w);
  if (bias) b_ = &register_parameter("bias", Shape{out});
}

void ConvNd::reset_parameters(std::mt19937_64& rng) {
  const float fan_in = static_cast<float>(in_ * kernel_volume());
  if (init_ == Init::KaimingNormalFanOut) {
    normal_fill(w_->value, std::sqrt(2.0f / static_cast<float>(out_ * kernel_volume())), rng);
  } else {
    uniform_fill(w_->value, 1.0f / std::sqrt(fan_in), rng);
  }
  if (b_) uniform_fill(b_->value, 1.0f / std::sqrt(fan_in), rng);
}

Tensor ConvNd::forward(const Tensor& x, Context& ctx) {
  bool fits = x.dim() == spatial_ + 2 && x.size(1) == in_;
  for (int a = 2; fits && a < x.dim(); ++a) fits = x.size(a) + 2 * g_.padding >= k_;
  FANOUT_USER_CHECK(fits) << type_name() << "(" << in_ << ", " << out_ << ", kernel " << k_ << ", padding "
                          << g_.padding << ") cannot take input of shape " << x.shape().str() << " (expected (N, "
                          << in_ << (spatial_ == 2 ? ", H, W))" : ", D, H, W))");
  const AutocastWeights::Cast in =
      autocast_.forward(ctx, x, w_->value, b_ ? &b_->value : nullptr, kernels::conv_rounds_in_low_type(ctx));
  x_ = in.x;
  ensure_autocast_output(y_, kernels::conv_output_shape(spatial_, x.shape(), w_->shape, g_), ctx);
  kernels::conv_forward(ctx, spatial_, in.x, in.w, b_ ? &in.b : nullptr, g_, y_);
  autocast_.round_output(ctx, y_);
  return y_;
}

Tensor ConvNd::backward(const Tensor& dy, Context& ctx) {
  Tensor* dx = nullptr;
  if (input_grad()) {
    ensure_like(dx_, x_, ctx);
    dx = &dx_;
  }
  const AutocastWeights::Sinks low =
      autocast_.backward_begin(ctx, dy, w_->value, w_->grad, b_ ? &b_->grad : nullptr);
  kernels::conv_backward(ctx, spatial_, x_, *low.w, low.dy, g_, dx, *low.gw, low.gb);
  autocast_.backward_end(ctx, w_->grad, b_ ? &b_->grad : nullptr, dx);
  notify_grads_ready(ctx);
  return input_grad() ? dx_ : Tensor();
}

}  // namespace fanout::models
