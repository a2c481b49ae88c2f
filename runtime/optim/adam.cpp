// Adam and AdamW optimizers. The step's scalars are computed as torch's
// Python computes them (double), then rounded to float for the kernel.
#include "runtime/optim/adam.h"

#include <cmath>

#include "kernels/optim.h"
#include "runtime/core/error.h"

namespace fanout::optim {

Adam::Adam(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups)
    : ArenaOptimizer(model, ctx, o, std::move(groups)) {
  FANOUT_CHECK(o.kind == OptimizerKind::Adam || o.kind == OptimizerKind::AdamW) << "Adam built for " << type();
  add_state("exp_avg");
  add_state("exp_avg_sq");
  if (o.amsgrad) add_state("max_exp_avg_sq");
}

void Adam::update(const Tensor& grads, const Group& g) {
  const OptimizerOptions& o = options();
  const double t = static_cast<double>(steps() + 1);
  const double lr = static_cast<double>(this->lr()) * g.lr_scale;
  const double beta1 = o.beta1, beta2 = o.beta2, wd = g.weight_decay;
  kernels::AdamStep h;
  const bool decoupled = kind() == OptimizerKind::AdamW;
  h.weight_decay = decoupled ? 0.0f : static_cast<float>(wd);
  h.decay = decoupled ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  h.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  h.beta2 = static_cast<float>(beta2);
  h.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  h.eps = static_cast<float>(o.eps);
  h.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  h.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
  h.amsgrad = o.amsgrad;
  Tensor none;
  Tensor p = params();
  kernels::adam_step(context(), p, grads, state_arena(0), state_arena(1),
                     o.amsgrad ? state_arena(2) : none, g.chunks, h);
}

}  // namespace fanout::optim
