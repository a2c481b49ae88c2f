// Single-device engine.
#include "runtime/parallel/single_device.h"

#include "runtime/core/error.h"

namespace fanout {

SingleDeviceEngine::SingleDeviceEngine(Module& model, Device device, const Criterion& criterion, uint64_t seed,
                                       const MathOptions& math, CudaGraphs graphs)
    : model_(model), ctx_(device, seed), criterion_(criterion.clone()), seed_(seed), graphs_(graphs, device) {
  ctx_.math = with_cpu_threads(math, 1);
  model_.to(device, &ctx_.compute());
  ctx_.compute().synchronize();  // the copy is complete before anyone loads into the model
  model_.set_input_grad(false);  // nothing upstream of the model needs dx
  apply_split_invariant(model_, device, math);
}

void SingleDeviceEngine::stage(const Tensor& x, const Tensor& y, const Tensor*& xin, const Tensor*& yin) {
  check_batch_given(x, y);
  const Device d = ctx_.device();
  xin = &x;
  yin = &y;
  if (d.is_cpu()) return;
  ensure(xd_, x.shape(), x.dtype(), d);
  ensure(yd_, y.shape(), y.dtype(), d);
  xd_.copy_from(x, &ctx_.compute());
  yd_.copy_from(y, &ctx_.compute());
  xin = &xd_;
  yin = &yd_;
}

StepResult SingleDeviceEngine::forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool) {
  const Tensor *xin = nullptr, *yin = nullptr;
  stage(x, y, xin, yin);
  ctx_.training = true;
  ctx_.pass_key = pass_key(seed_, pass_++);
  model_.train(true);
  const auto& a = model_.arenas();
  const std::string key = step_graph_key(*xin, *yin, grad_scale, {a.params.raw(), a.grads.raw(), a.buffers.raw()});
  graphs_.train_step(ctx_, key, [&] {
    Tensor out = model_.forward(*xin, ctx_);
    criterion_->forward(ctx_, out, *yin, true, grad_scale);
    Module::backward_of(model_, "model", criterion_->grad(), ctx_);
  });
  return criterion_->read(ctx_);
}

StepResult SingleDeviceEngine::eval_step(const Tensor& x, const Tensor& y) {
  graphs_.other_pass();
  const Tensor *xin = nullptr, *yin = nullptr;
  stage(x, y, xin, yin);
  ctx_.training = false;
  model_.train(false);
  Tensor out = model_.forward(*xin, ctx_);
  criterion_->forward(ctx_, out, *yin, false, 0.0f);
  return criterion_->read(ctx_);
}

}  // namespace fanout
