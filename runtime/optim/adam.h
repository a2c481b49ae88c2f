// Adam and AdamW: torch.optim.Adam (L2 weight decay added to the gradient)
// and torch.optim.AdamW (decoupled: p *= 1 - lr * weight_decay), bias
// correction, eps outside the square root, amsgrad; one fused kernel per
// parameter group and step, float32 state "exp_avg", "exp_avg_sq" and,
// with amsgrad, "max_exp_avg_sq".
#pragma once
#include "runtime/optim/optimizer.h"

namespace fanout::optim {

class Adam final : public ArenaOptimizer {
 public:
  // o.kind: Adam or AdamW.
  Adam(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups = {});

 private:
  void update(const Tensor& grads, const Group& g) override;
};

}  // namespace fanout::optim
