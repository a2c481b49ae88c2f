// The plain engine: one model on one device, no replicas.
#pragma once
#include <memory>

#include "runtime/core/context.h"
#include "runtime/parallel/engine.h"

namespace fanout {

class SingleDeviceEngine : public Engine {
 public:
  // Moves the model to `device`; the engine owns neither the model's tree nor its arenas' layout.
  // The criterion is cloned.
  SingleDeviceEngine(Module& model, Device device, const Criterion& criterion, uint64_t seed,
                     const MathOptions& math = {});
  StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override;
  void set_pass(uint64_t index) override { pass_ = index; }
  int64_t bytes_to_primary() const override { return 0; }
  Module& model() override { return model_; }
  Context& primary_context() override { return ctx_; }
  std::vector<Device> devices() const override { return {ctx_.device()}; }
  const Criterion& criterion() const override { return *criterion_; }

 private:
  void forward_loss(const Tensor& x, const Tensor& y, bool train, float grad_scale);
  Module& model_;
  Context ctx_;
  std::unique_ptr<Criterion> criterion_;
  uint64_t seed_, pass_ = 0;
  Tensor xd_, yd_;
};

}  // namespace fanout
