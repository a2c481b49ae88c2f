// Public SGD entry point: hyper-parameter and arena checks, then dispatch.
#include "kernels/sgd.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first) {
  const char* op = "sgd_step";
  detail::check_tensor(ctx, op, "params", params);
  detail::check_tensor(ctx, op, "grads", grads);
  FANOUT_CHECK(params.numel() == grads.numel()) << op << ": params " << params.shape().str() << " and grads "
                                                << grads.shape().str() << " differ in numel";
  // Same checks as torch.optim.SGD's constructor.
  FANOUT_CHECK(h.lr >= 0.0f && h.momentum >= 0.0f && h.weight_decay >= 0.0f)
      << op << ": lr " << h.lr << ", momentum " << h.momentum << " and weight_decay " << h.weight_decay
      << " must be >= 0";
  FANOUT_CHECK(!h.nesterov || (h.momentum > 0.0f && h.dampening == 0.0f))
      << op << ": nesterov needs momentum > 0 and zero dampening (momentum " << h.momentum << ", dampening "
      << h.dampening << ")";
  if (h.momentum != 0.0f) {
    detail::check_tensor(ctx, op, "momentum_buf", momentum_buf);
    FANOUT_CHECK(momentum_buf.numel() == params.numel()) << op << ": momentum_buf " << momentum_buf.shape().str()
                                                         << " for params " << params.shape().str();
  }
  FANOUT_DISPATCH(ctx, sgd_step, ctx, params, grads, momentum_buf, h, first);
}

}  // namespace fanout::kernels
