// SGD optimizer.
#include "runtime/optim/sgd.h"

#include "runtime/core/error.h"

namespace fanout::optim {

SGD::SGD(Module& model, const kernels::SgdHyper& h) : model_(model), h_(h) {
  FANOUT_USER_CHECK(h.lr > 0) << "learning rate must be positive, got " << h.lr;
  FANOUT_USER_CHECK(h.momentum >= 0) << "momentum must be non-negative, got " << h.momentum;
  FANOUT_USER_CHECK(h.weight_decay >= 0) << "weight decay must be non-negative, got " << h.weight_decay;
  FANOUT_USER_CHECK(!h.nesterov || (h.momentum > 0 && h.dampening == 0))
      << "Nesterov momentum requires a momentum and zero dampening";
  if (h.momentum != 0) buf_ = Tensor::zeros(model.arenas().params.shape(), DType::F32, model.device());
}

void SGD::step(Context& ctx) {
  auto& a = model_.arenas();
  Tensor grads = a.grads;
  if (grads.dtype() == DType::F64) {
    FANOUT_CHECK(grads.device().is_cpu()) << "float64 gradients on " << grads.device().str();
    ensure(grad32_, grads.shape(), DType::F32, grads.device());
    const double* src = grads.f64();
    float* dst = grad32_.f32();
    for (int64_t i = 0; i < grads.numel(); ++i) dst[i] = static_cast<float>(src[i]);
    grads = grad32_;
  }
  kernels::sgd_step(ctx, a.params, grads, buf_.defined() ? buf_ : grads, h_, first_);
  if (h_.momentum != 0) first_ = false;
  ++steps_;
}

void SGD::zero_grad(Context& ctx) { model_.arenas().grads.zero(&ctx.compute()); }

}  // namespace fanout::optim
