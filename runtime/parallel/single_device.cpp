// Single-device engine.
#include "runtime/parallel/single_device.h"

#include "kernels/loss.h"

namespace fanout {

SingleDeviceEngine::SingleDeviceEngine(Module& model, Device device, const kernels::SgdHyper& sgd,
                                       const LossOptions& loss, uint64_t seed, const MathOptions& math)
    : model_(model), ctx_(device, seed), loss_(loss) {
  ctx_.math = math;
  model_.to(device, &ctx_.compute());
  model_.set_input_grad(false);  // nothing upstream of the model needs dx
  apply_split_invariant(model_, device, math);
  sgd_ = std::make_unique<optim::SGD>(model_, sgd);
  loss_h_ = Tensor::empty(Shape{1});
  correct_h_ = Tensor::empty(Shape{1}, DType::I32);
}

StepResult SingleDeviceEngine::forward_loss(const Tensor& x, const Tensor& y, bool train) {
  const Device d = ctx_.device();
  const Tensor* xin = &x;
  const Tensor* yin = &y;
  if (!d.is_cpu()) {
    ensure(xd_, x.shape(), DType::F32, d);
    ensure(yd_, y.shape(), DType::I32, d);
    xd_.copy_from(x, &ctx_.compute());
    yd_.copy_from(y, &ctx_.compute());
    xin = &xd_;
    yin = &yd_;
  }
  ctx_.training = train;
  model_.train(train);
  Tensor logits = model_.forward(*xin, ctx_);
  ensure(probs_, logits.shape(), d);
  ensure(loss_t_, Shape{1}, d);
  ensure(correct_t_, Shape{1}, DType::I32, d);
  kernels::softmax_xent_forward(ctx_, logits, *yin, loss_.label_smoothing, probs_, loss_t_);
  kernels::count_correct(ctx_, logits, *yin, correct_t_);
  if (train) {
    ensure(dlogits_, logits.shape(), d);
    kernels::softmax_xent_backward(ctx_, probs_, *yin, loss_.label_smoothing, 1.0f / static_cast<float>(x.size(0)),
                                   dlogits_);
  }
  return {};
}

StepResult SingleDeviceEngine::train_step(const Tensor& x, const Tensor& y, float lr) {
  forward_loss(x, y, true);
  model_.backward(dlogits_, ctx_);
  sgd_->set_lr(lr);
  sgd_->step(ctx_);
  sgd_->zero_grad(ctx_);
  loss_h_.copy_from(loss_t_, &ctx_.compute());
  correct_h_.copy_from(correct_t_, &ctx_.compute());
  ctx_.compute().synchronize();
  return {static_cast<double>(loss_h_.f32()[0]) * x.size(0), correct_h_.data<int32_t>()[0], x.size(0)};
}

StepResult SingleDeviceEngine::eval_step(const Tensor& x, const Tensor& y) {
  forward_loss(x, y, false);
  loss_h_.copy_from(loss_t_, &ctx_.compute());
  correct_h_.copy_from(correct_t_, &ctx_.compute());
  ctx_.compute().synchronize();
  return {static_cast<double>(loss_h_.f32()[0]) * x.size(0), correct_h_.data<int32_t>()[0], x.size(0)};
}

}  // namespace fanout
