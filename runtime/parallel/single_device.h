// The plain engine: one model on one device, no replicas.
#pragma once
#include <memory>

#include "runtime/core/context.h"
#include "runtime/parallel/engine.h"
#include "runtime/parallel/step_graph.h"

namespace fanout {

class SingleDeviceEngine : public Engine {
 public:
  // Moves the model to `device`; the engine owns neither the model's tree nor its arenas' layout.
  // The criterion is cloned.
  SingleDeviceEngine(Module& model, Device device, const Criterion& criterion, uint64_t seed,
                     const MathOptions& math = {}, CudaGraphs graphs = CudaGraphs::Auto);
  StepResult forward_backward(const Tensor& x, const Tensor& y, float grad_scale, bool sync) override;
  StepResult eval_step(const Tensor& x, const Tensor& y) override;
  void set_pass(uint64_t index) override { pass_ = index; }
  int64_t bytes_to_primary() const override { return 0; }
  Module& model() override { return model_; }
  Context& primary_context() override { return ctx_; }
  std::vector<Device> devices() const override { return {ctx_.device()}; }
  const Criterion& criterion() const override { return *criterion_; }
  GraphStats graph_stats() const override { return graphs_.stats(); }

 private:
  // x and y on the device (copied into xd_ and yd_ there, which stay put).
  void stage(const Tensor& x, const Tensor& y, const Tensor*& xin, const Tensor*& yin);
  Module& model_;
  Context ctx_;
  std::unique_ptr<Criterion> criterion_;
  uint64_t seed_, pass_ = 0;
  Tensor xd_, yd_;
  StepGraphs graphs_;
};

}  // namespace fanout
