// SGD optimizer.
#include "runtime/optim/sgd.h"

#include "kernels/optim.h"

namespace fanout::optim {

SGD::SGD(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups)
    : ArenaOptimizer(model, ctx, o, std::move(groups)) {
  if (o.momentum != 0) add_state("momentum_buffer");
}

void SGD::update(const Tensor& grads, const Group& g) {
  const OptimizerOptions& o = options();
  kernels::SgdStep h;
  h.lr = static_cast<float>(static_cast<double>(lr()) * g.lr_scale);
  h.momentum = static_cast<float>(o.momentum);
  h.dampening = static_cast<float>(o.dampening);
  h.weight_decay = static_cast<float>(g.weight_decay);
  h.nesterov = o.nesterov;
  h.first = steps() == 0;
  Tensor none;
  Tensor p = params();
  kernels::sgd_step(context(), p, grads, o.momentum != 0 ? state_arena(0) : none, g.chunks, h);
}

}  // namespace fanout::optim
