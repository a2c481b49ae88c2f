// Transposed convolution layers.
#include "models/layers/conv_transpose.h"

#include <cmath>
#include <sstream>

#include "kernels/conv.h"
#include "kernels/conv_bias.h"
#include "models/layers/init.h"
#include "runtime/core/error.h"

namespace fanout::models {

ConvTranspose::ConvTranspose(int spatial_dims, int64_t in, int64_t out, int64_t kernel, int64_t stride,
                             int64_t padding, int64_t output_padding, bool bias)
    : dims_(spatial_dims), in_(in), out_(out), k_(kernel), stride_(stride), pad_(padding), out_pad_(output_padding) {
  FANOUT_USER_CHECK(spatial_dims == 2 || spatial_dims == 3)
      << "ConvTranspose takes 2 or 3 spatial dimensions, got " << spatial_dims;
  FANOUT_USER_CHECK(in > 0 && out > 0 && kernel > 0 && stride > 0 && padding >= 0 && output_padding >= 0)
      << "bad " << type_name() << " hyper-parameters: in " << in << ", out " << out << ", kernel " << kernel
      << ", stride " << stride << ", padding " << padding << ", output_padding " << output_padding;
  FANOUT_USER_CHECK(output_padding < stride)
      << type_name() << ": output_padding " << output_padding << " must be smaller than the stride " << stride;
  Shape w{in, out, kernel, kernel};
  if (dims_ == 3) w = Shape{in, out, kernel, kernel, kernel};
  w_ = &register_parameter("weight", w);
  if (bias) b_ = &register_parameter("bias", Shape{out});
}

void ConvTranspose::reset_parameters(std::mt19937_64& rng) {
  // torch: kaiming_uniform_(a=sqrt(5)) with fan_in from the weight's second dim.
  const float fan_in = static_cast<float>(out_ * (dims_ == 2 ? k_ * k_ : k_ * k_ * k_));
  uniform_fill(w_->value, 1.0f / std::sqrt(fan_in), rng);
  if (b_) uniform_fill(b_->value, 1.0f / std::sqrt(fan_in), rng);
}

Shape ConvTranspose::output_shape(const Shape& x) const {
  Shape y = x;
  y.d[1] = out_;
  for (int i = 2; i < x.ndim; ++i) y.d[i] = (x.d[i] - 1) * stride_ - 2 * pad_ + k_ + out_pad_;
  return y;
}

Tensor ConvTranspose::forward(const Tensor& x, Context& ctx) {
  bool fits = x.dim() == dims_ + 2 && x.size(1) == in_;
  const Shape ys = fits ? output_shape(x.shape()) : Shape{};
  for (int i = 2; fits && i < ys.ndim; ++i) fits = ys[i] >= 1;
  FANOUT_USER_CHECK(fits) << type_name() << "(" << in_ << ", " << out_ << ", kernel " << k_ << ", stride " << stride_
                          << ", padding " << pad_ << ") cannot take input of shape " << x.shape().str();
  const AutocastWeights::Cast in =
      autocast_.forward(ctx, x, w_->value, b_ ? &b_->value : nullptr, kernels::conv_rounds_in_low_type(ctx));
  x_ = in.x;
  ensure_autocast_output(y_, ys, ctx);
  Tensor none;  // no weight gradient: only the convolution's input gradient
  if (dims_ == 2) kernels::conv2d_backward(ctx, y_, in.w, in.x, {stride_, pad_}, &y_, none, nullptr);
  else kernels::conv3d_backward(ctx, y_, in.w, in.x, {stride_, pad_}, &y_, none, nullptr);
  if (b_) kernels::channel_bias_add(ctx, y_, in.b);
  autocast_.round_output(ctx, y_);
  return y_;
}

Tensor ConvTranspose::backward(const Tensor& dy_in, Context& ctx) {
  const AutocastWeights::Sinks low =
      autocast_.backward_begin(ctx, dy_in, w_->value, w_->grad, b_ ? &b_->grad : nullptr);
  const Tensor& dy = low.dy;
  // dW: the convolution's weight gradient with dy as its input and x as its output gradient.
  if (dims_ == 2) kernels::conv2d_backward(ctx, dy, *low.w, x_, {stride_, pad_}, nullptr, *low.gw, nullptr);
  else kernels::conv3d_backward(ctx, dy, *low.w, x_, {stride_, pad_}, nullptr, *low.gw, nullptr);
  if (b_) kernels::channel_bias_grad(ctx, dy, *low.gb);
  Tensor* dx = nullptr;
  if (input_grad()) {
    ensure_like(dx_, x_, ctx);
    dx = &dx_;
    if (dims_ == 2) kernels::conv2d_forward(ctx, dy, *low.w, nullptr, {stride_, pad_}, dx_);
    else kernels::conv3d_forward(ctx, dy, *low.w, nullptr, {stride_, pad_}, dx_);
  }
  autocast_.backward_end(ctx, w_->grad, b_ ? &b_->grad : nullptr, dx);
  notify_grads_ready(ctx);
  return input_grad() ? dx_ : Tensor();
}

}  // namespace fanout::models
