// Upsample3d (see upsample.h).
#include "models/layers/upsample.h"

#include "runtime/core/error.h"

namespace fanout::models {

Upsample3d::Upsample3d(int64_t scale) : scale_(scale) {
  FANOUT_USER_CHECK(scale >= 1) << "bad Upsample3d scale factor " << scale << " (must be a positive integer)";
}

Tensor Upsample3d::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 5) << "Upsample3d(scale " << scale_ << ") cannot take input of shape "
                                  << x.shape().str() << " (expected (N, C, D, H, W))";
  in_ = TensorSpec(x);
  ensure(y_, kernels::upsample3d_output_shape(x.shape(), scale_), x.dtype(), ctx, x.format());
  kernels::upsample3d_nearest_forward(ctx, x, scale_, y_);
  return y_;
}

Tensor Upsample3d::backward(const Tensor& dy, Context& ctx) {
  if (!input_grad()) return Tensor();
  in_.ensure(dx_, ctx);
  kernels::upsample3d_nearest_backward(ctx, dy, scale_, dx_);
  return dx_;
}

}  // namespace fanout::models
