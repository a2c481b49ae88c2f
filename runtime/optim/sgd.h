// SGD: torch.optim.SGD (weight decay added to the gradient, momentum buffer
// made from the first gradient, dampening, Nesterov), one fused kernel per
// parameter group and step. State: "momentum_buffer" when momentum != 0.
#pragma once
#include "runtime/optim/optimizer.h"

namespace fanout::optim {

class SGD final : public ArenaOptimizer {
 public:
  SGD(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups = {});

 private:
  void update(const Tensor& grads, const Group& g) override;
};

}  // namespace fanout::optim
