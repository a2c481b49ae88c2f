// Single-device engine.
#include "runtime/parallel/single_device.h"

namespace fanout {

SingleDeviceEngine::SingleDeviceEngine(Module& model, Device device, const Criterion& criterion, uint64_t seed,
                                       const MathOptions& math)
    : model_(model), ctx_(device, seed), criterion_(criterion.clone()), seed_(seed) {
  ctx_.math = with_cpu_threads(math, 1);
  model_.to(device, &ctx_.compute());
  ctx_.compute().synchronize();  // the copy is complete before anyone loads into the model
  model_.set_input_grad(false);  // nothing upstream of the model needs dx
  apply_split_invariant(model_, device, math);
}

void SingleDeviceEngine::forward_loss(const Tensor& x, const Tensor& y, bool train, float grad_scale) {
  const Device d = ctx_.device();
  const Tensor* xin = &x;
  const Tensor* yin = &y;
  if (!d.is_cpu()) {
    ensure(xd_, x.shape(), x.dtype(), d);
    ensure(yd_, y.shape(), y.dtype(), d);
    xd_.copy_from(x, &ctx_.compute());
    yd_.copy_from(y, &ctx_.compute());
    xin = &xd_;
    yin = &yd_;
  }
  ctx_.training = train;
  if (train) ctx_.pass_key = pass_key(seed_, pass_++);
  model_.train(train);
  Tensor out = model_.forward(*xin, ctx_);
  criterion_->forward(ctx_, out, *yin, train, grad_scale);
}

StepResult SingleDeviceEngine::forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool) {
  forward_loss(x, y, true, grad_scale);
  Module::backward_of(model_, "model", criterion_->grad(), ctx_);
  return criterion_->read(ctx_);
}

StepResult SingleDeviceEngine::eval_step(const Tensor& x, const Tensor& y) {
  forward_loss(x, y, false, 0.0f);
  return criterion_->read(ctx_);
}

}  // namespace fanout
