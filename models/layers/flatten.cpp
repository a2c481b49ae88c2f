// Flatten layer.
#include "models/layers/flatten.h"

#include "runtime/core/error.h"

namespace fanout::models {

Tensor Flatten::forward(const Tensor& x, Context&) {
  FANOUT_USER_CHECK(x.dim() >= 1) << "Flatten cannot take a 0-d tensor";
  in_shape_ = x.shape();
  const int64_t n = x.size(0);
  return x.view(Shape{n, n == 0 ? 0 : x.numel() / n});
}

Tensor Flatten::backward(const Tensor& dy, Context&) {
  if (!input_grad()) return Tensor();
  return dy.view(in_shape_);
}

}  // namespace fanout::models
