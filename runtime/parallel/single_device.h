// The plain engine: one model on one device, no replicas.
#pragma once
#include <memory>

#include "runtime/core/context.h"
#include "runtime/parallel/engine.h"

namespace fanout {

class SingleDeviceEngine : public Engine {
 public:
  // Moves the model to `device`; the engine owns neither the model's tree nor its arenas' layout.
  SingleDeviceEngine(Module& model, Device device, const kernels::SgdHyper& sgd, const LossOptions& loss,
                     uint64_t seed, const MathOptions& math = {});
  StepResult train_step(const Tensor& x, const Tensor& y, float lr) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override;
  Module& model() override { return model_; }
  optim::SGD& optimizer() override { return *sgd_; }
  Context& primary_context() override { return ctx_; }

 private:
  StepResult forward_loss(const Tensor& x, const Tensor& y, bool train);
  Module& model_;
  Context ctx_;
  std::unique_ptr<optim::SGD> sgd_;
  LossOptions loss_;
  Tensor xd_, yd_, probs_, loss_t_, correct_t_, dlogits_, loss_h_, correct_h_;
};

}  // namespace fanout
