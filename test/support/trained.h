// Engines with the optimizer a Trainer would give them, for tests that step
// by hand: Trained<E> is engine E (constructed from the same arguments) plus
// an optimizer over its model, with train_step(x, y, lr) as the Trainer
// takes a step (forward_backward_batch, step, zero_grad).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/sharded_optimizer.h"
#include "runtime/train/trainer.h"
#include "support/test_util.h"

namespace fanout::testing {

// The SGD settings the training tests share: lr 0.05, momentum 0.9, weight decay 5e-4.
inline optim::OptimizerOptions test_sgd() {
  optim::OptimizerOptions o;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.weight_decay = 5e-4f;
  return o;
}

// AdamW with amsgrad, weight decay 0.05 and the "no_decay" group: the
// optimizer tests' common setting (every state arena and both groups in use).
inline optim::OptimizerOptions test_adamw(float lr = 1e-3f) {
  optim::OptimizerOptions o;
  o.kind = optim::OptimizerKind::AdamW;
  o.lr = lr;
  o.weight_decay = 0.05;
  o.amsgrad = true;
  o.no_decay_norm_bias = true;
  return o;
}

template <class E>
class Trained : public E {
 public:
  template <class... A>
  explicit Trained(A&&... a) : E(std::forward<A>(a)...) {
    set_optimizer(test_sgd());
  }
  void set_optimizer(const optim::OptimizerOptions& o) {
    opt_ = optim::make_optimizer(E::model(), E::step_context(), o);
  }
  optim::Optimizer& optimizer() { return *opt_; }
  StepResult train_step(const Tensor& x, const Tensor& y, float lr) { return train::train_step(*this, *opt_, x, y, lr); }

 private:
  std::unique_ptr<optim::Optimizer> opt_;
};

// The same for an engine made elsewhere (make_engine).
struct EngineRun {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<optim::Optimizer> opt;
  EngineRun() = default;
  explicit EngineRun(std::unique_ptr<Engine> e, const optim::OptimizerOptions& o = test_sgd())
      : engine(std::move(e)),
        opt(engine->sharding() ? train::make_engine_optimizer(*engine, o)
                               : optim::make_optimizer(engine->model(), engine->primary_context(), o)) {}
  StepResult train_step(const Tensor& x, const Tensor& y, float lr) {
    return train::train_step(*engine, *opt, x, y, lr);
  }
  Engine* operator->() { return engine.get(); }
};

// An engine on `devices` ("cpu", "cpu:2", ...), DataParallel beyond one
// device; split-invariant math: the same bits on any split.
inline EngineSpec engine_on(const std::string& devices, bool split_invariant = true) {
  EngineSpec spec;
  spec.devices = parse_devices(devices);
  spec.force_data_parallel = devices != "cpu";
  spec.dp.math.split_invariant = split_invariant;
  return spec;
}

// m's parameters (on the host) after one test_sgd() step with `lr` per batch
// on engine_on(devices).
inline Tensor trained_params(Module& m, const std::string& devices, const std::vector<Batch>& data,
                             float lr = 0.05f) {
  EngineRun e(make_engine(m, engine_on(devices)));
  for (const Batch& b : data) e.train_step(b.x, b.y, lr);
  return m.arenas().params.to(Device::cpu());
}

}  // namespace fanout::testing
