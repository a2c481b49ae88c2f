// Flatten layer.
#include "models/layers/flatten.h"

#include "kernels/convert.h"
#include "runtime/core/error.h"

namespace fanout::models {

Tensor Flatten::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() >= 1) << "Flatten cannot take a 0-d tensor";
  in_ = TensorSpec(x);
  const int64_t n = x.size(0);
  const Shape flat{n, n == 0 ? 0 : x.numel() / n};
  if (!x.channels_last()) return x.view(flat);
  ensure(y_, x.shape(), x.dtype(), ctx);
  kernels::convert(ctx, x, y_);
  return y_.view(flat);
}

Tensor Flatten::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  const Tensor d = dy.view(in_.shape);
  if (in_.format != MemoryFormat::ChannelsLast) return d;
  in_.ensure(dx_, ctx);
  kernels::convert(ctx, d, dx_);
  return dx_;
}

}  // namespace fanout::models
