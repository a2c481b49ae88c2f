// Optimizer kernel entry points: argument checks, then dispatch.
#include "kernels/optim.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
void check_arena(Context& ctx, const char* op, const char* what, const Tensor& t, const Tensor& params) {
  detail::check_tensor(ctx, op, what, t);
  FANOUT_CHECK(t.numel() == params.numel())
      << op << ": " << what << " " << t.shape().str() << " for params " << params.shape().str();
}

void check_chunks(Context& ctx, const char* op, const Tensor& chunks, int64_t n) {
  FANOUT_CHECK(chunks.defined() && chunks.dtype() == DType::I64 && chunks.dim() == 2 && chunks.size(1) == 2 &&
               chunks.device().same_memory(ctx.device()))
      << op << ": the chunk table must be an I64 (K, 2) tensor on " << ctx.device().str();
  if (!chunks.device().is_cpu()) return;  // built by the host from the same checks
  const int64_t* c = chunks.data<int64_t>();
  for (int64_t k = 0; k < chunks.size(0); ++k)
    FANOUT_CHECK(c[2 * k] >= 0 && c[2 * k + 1] >= 1 && c[2 * k + 1] <= kUpdateChunk && c[2 * k] + c[2 * k + 1] <= n)
        << op << ": chunk " << k << " (" << c[2 * k] << ", " << c[2 * k + 1] << ") outside an arena of " << n;
}
}  // namespace

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const Tensor& chunks,
              const SgdStep& h) {
  const char* op = "sgd_step";
  detail::check_tensor(ctx, op, "params", params);
  check_arena(ctx, op, "grads", grads, params);
  check_chunks(ctx, op, chunks, params.numel());
  FANOUT_CHECK(h.lr >= 0.0f && h.momentum >= 0.0f && h.weight_decay >= 0.0f)
      << op << ": lr " << h.lr << ", momentum " << h.momentum << " and weight_decay " << h.weight_decay
      << " must be >= 0";
  FANOUT_CHECK(!h.nesterov || (h.momentum > 0.0f && h.dampening == 0.0f))
      << op << ": nesterov needs momentum > 0 and zero dampening";
  if (h.momentum != 0.0f) check_arena(ctx, op, "momentum_buf", momentum_buf, params);
  FANOUT_DISPATCH(ctx, sgd_step, ctx, params, grads, momentum_buf, chunks, h);
}

void adam_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h) {
  const char* op = "adam_step";
  detail::check_tensor(ctx, op, "params", params);
  check_arena(ctx, op, "grads", grads, params);
  check_arena(ctx, op, "exp_avg", exp_avg, params);
  check_arena(ctx, op, "exp_avg_sq", exp_avg_sq, params);
  if (h.amsgrad) check_arena(ctx, op, "max_exp_avg_sq", max_exp_avg_sq, params);
  check_chunks(ctx, op, chunks, params.numel());
  FANOUT_CHECK(h.eps >= 0.0f && h.bias_correction2_sqrt > 0.0f && h.weight_decay >= 0.0f)
      << op << ": eps " << h.eps << ", bias correction " << h.bias_correction2_sqrt << ", weight_decay "
      << h.weight_decay;
  FANOUT_DISPATCH(ctx, adam_step, ctx, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, chunks, h);
}

double sum_squares(Context& ctx, const Tensor& x) {
  detail::check_tensor(ctx, "sum_squares", "x", x);
  if (x.numel() == 0) return 0.0;
  FANOUT_DISPATCH(ctx, sum_squares, ctx, x);
}

void clamp_abs(Context& ctx, Tensor& x, float limit) {
  detail::check_tensor(ctx, "clamp_abs", "x", x);
  FANOUT_CHECK(limit >= 0.0f) << "clamp_abs: limit " << limit << " must be >= 0";
  FANOUT_DISPATCH(ctx, clamp_abs, ctx, x, limit);
}

}  // namespace fanout::kernels
