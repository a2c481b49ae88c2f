// The scale and shift of a normalization layer whose kernel always applies
// one (GroupNorm, InstanceNorm, LayerNorm): the layer's weight and bias, or,
// without them (affine=False), the identity's gamma 1 and beta 0 on the
// device and zeroed sinks for the gradients the kernel adds into.
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

// Where a float32 normalization's backward writes dx: over dy when x and dy
// share their storage (backward may overwrite dy), else `buf` like x (a
// low-type input's gradient, rounded as it is stored); `buf` as float32
// scratch when no input gradient is wanted.
Tensor norm_input_grad(bool wanted, const Tensor& x, const Tensor& dy, Tensor& buf, Context& ctx);

class NormAffine {
 public:
  // w and b: the layer's registered weight and bias, both null, or a
  // weight alone (torch's LayerNorm(bias=False): beta is 0).
  NormAffine(const Shape& shape, Parameter* w, Parameter* b) : shape_(shape), w_(w), b_(b) {}
  bool affine() const { return w_ != nullptr; }
  // Weight 1, bias 0 (on the CPU, before the model moves).
  void reset();
  // gamma and beta on ctx's device.
  const Tensor& gamma(Context& ctx);
  const Tensor& beta(Context& ctx);
  // Where the kernel adds the gradients of gamma and beta: the parameters'
  // gradients, or sinks zeroed on ctx's compute stream.
  struct Grads {
    Tensor& dgamma;
    Tensor& dbeta;
  };
  Grads grads(Context& ctx);

 private:
  void ensure_identity(Context& ctx);
  Shape shape_;
  Parameter *w_, *b_;
  Tensor ones_, zeros_, dgamma_, dbeta_;
};

}  // namespace fanout::models
