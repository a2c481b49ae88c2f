// Attention entry points: checks, then dispatch (float32, bfloat16 or float16
// tensors, lse float32 always; the CPU backend gets low types staged to
// float32), and the per-thread record
// of the path each pass took (attention_last_path).
#include "kernels/attention.h"

#include <climits>
#include <cmath>

#include <utility>

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {
// The calling thread's last path per pass (attention_last_path).
thread_local const char* last_path[2] = {nullptr, nullptr};
}  // namespace

const char* attention_last_path(AttentionPass pass) { return last_path[static_cast<int>(pass)]; }

void detail::note_attention_path(AttentionPass pass, const char* path) { last_path[static_cast<int>(pass)] = path; }

namespace {
// q, k and v of one dtype: float32, bfloat16 or float16, on the context's device.
void check_qkv_types(const Context& ctx, const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  FANOUT_CHECK(q.defined()) << op << ": q is undefined";
  const DType dt = q.dtype();
  FANOUT_USER_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16)
      << op << ": q is " << dtype_name(dt) << "; attention takes float32, bfloat16 or float16";
  detail::check_tensor(ctx, op, "q", q, dt);
  detail::check_tensor(ctx, op, "k", k, dt);
  detail::check_tensor(ctx, op, "v", v, dt);
}

// q (B, H, T, D) with T, D >= 1, float32, bfloat16 or float16;
// k, v of q's shape and dtype; lse (B, H, T) float32.
void check_qkv(const Context& ctx, const char* op, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
               const Tensor& lse) {
  check_qkv_types(ctx, op, q, k, v);
  detail::check_tensor(ctx, op, "lse", lse);
  FANOUT_CHECK(q.dim() == 4 && q.size(2) >= 1 && q.size(3) >= 1 && q.size(2) <= INT_MAX && q.size(3) <= INT_MAX)
      << op << ": q " << q.shape().str() << " must be (B, H, T, D) with T, D >= 1";
  FANOUT_CHECK(k.shape() == q.shape() && v.shape() == q.shape())
      << op << ": q " << q.shape().str() << ", k " << k.shape().str() << " and v " << v.shape().str()
      << " must have one shape";
  FANOUT_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}))
      << op << ": lse " << lse.shape().str() << " must be (B, H, T) for q " << q.shape().str();
  FANOUT_CHECK(std::isfinite(scale)) << op << ": scale " << scale << " is not finite";
  // The CUDA backend launches a block per score row and batches its GEMMs over B * H.
  FANOUT_CHECK(!ctx.device().is_cuda() ||
               (q.size(0) * q.size(1) * q.size(2) <= INT32_MAX && q.size(0) * q.size(1) <= INT32_MAX))
      << op << ": q " << q.shape().str() << " has too many rows";
}

void check_like_q(const Context& ctx, const char* op, const char* name, const Tensor& t, const Tensor& q) {
  detail::check_tensor(ctx, op, name, t, q.dtype());
  FANOUT_CHECK(t.shape() == q.shape()) << op << ": " << name << " " << t.shape().str() << " must be q's shape "
                                       << q.shape().str();
}
}  // namespace

void attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale, Tensor& y,
                       Tensor& lse) {
  const char* op = "attention_forward";
  check_qkv(ctx, op, q, k, v, scale, lse);
  check_like_q(ctx, op, "y", y, q);
  if (q.numel() == 0) return;
  if (ctx.device().is_cuda()) FANOUT_DISPATCH(ctx, attention_forward, ctx, q, k, v, scale, y, lse);
  // The CPU backend reads float32: low-type operands are staged (roles 0 to 3).
  detail::note_attention_path(AttentionPass::Forward, "cpu");
  const Tensor qs = detail::staged_in(ctx, op, "q", 0, q), ks = detail::staged_in(ctx, op, "k", 1, k),
               vs = detail::staged_in(ctx, op, "v", 2, v);
  Tensor ys = detail::staged_out(ctx, op, "y", 3, y);
  FANOUT_CALL_BACKEND(ctx, attention_forward, ctx, qs, ks, vs, scale, ys, lse);
  detail::unstage(ctx, ys, y);
}

void attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                        const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  check_qkv(ctx, op, q, k, v, scale, lse);
  check_like_q(ctx, op, "y", y, q);
  check_like_q(ctx, op, "dy", dy, q);
  check_like_q(ctx, op, "dq", dq, q);
  check_like_q(ctx, op, "dk", dk, q);
  check_like_q(ctx, op, "dv", dv, q);
  if (q.numel() == 0) return;
  if (ctx.device().is_cuda()) FANOUT_DISPATCH(ctx, attention_backward, ctx, q, k, v, scale, y, lse, dy, dq, dk, dv);
  detail::note_attention_path(AttentionPass::Backward, "cpu");
  const Tensor qs = detail::staged_in(ctx, op, "q", 0, q), ks = detail::staged_in(ctx, op, "k", 1, k),
               vs = detail::staged_in(ctx, op, "v", 2, v), ys = detail::staged_in(ctx, op, "y", 3, y),
               dys = detail::staged_in(ctx, op, "dy", 4, dy);
  Tensor dqs = detail::staged_out(ctx, op, "dq", 5, dq), dks = detail::staged_out(ctx, op, "dk", 6, dk),
         dvs = detail::staged_out(ctx, op, "dv", 7, dv);
  FANOUT_CALL_BACKEND(ctx, attention_backward, ctx, qs, ks, vs, scale, ys, lse, dys, dqs, dks, dvs);
  for (auto [from, to] : {std::pair<const Tensor*, Tensor*>{&dqs, &dq}, {&dks, &dk}, {&dvs, &dv}})
    detail::unstage(ctx, *from, *to);
}

void attention_decode(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, int64_t n, float scale,
                      Tensor& y) {
  const char* op = "attention_decode";
  check_qkv_types(ctx, op, q, k, v);
  check_like_q(ctx, op, "y", y, q);
  FANOUT_CHECK(q.dim() == 4 && q.size(2) >= 1 && q.size(3) >= 1 && q.size(3) <= INT_MAX)
      << op << ": q " << q.shape().str() << " must be (B, H, Tq, D) with Tq, D >= 1";
  FANOUT_CHECK(k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
               k.size(3) == q.size(3))
      << op << ": k " << k.shape().str() << " and v " << v.shape().str() << " must be (B, H, Tk, D) for q "
      << q.shape().str();
  FANOUT_CHECK(q.size(2) <= n && n <= k.size(2))
      << op << ": " << n << " cached positions for " << q.size(2) << " queries and a cache of " << k.size(2);
  FANOUT_CHECK(std::isfinite(scale)) << op << ": scale " << scale << " is not finite";
  FANOUT_CHECK(!ctx.device().is_cuda() || q.size(0) * q.size(1) * q.size(2) <= INT32_MAX)
      << op << ": q " << q.shape().str() << " has too many rows";
  if (q.numel() == 0) return;
  // Both backends read the storage as it is (the cache's unused rows are never touched).
  FANOUT_DISPATCH(ctx, attention_decode, ctx, q, k, v, n, scale, y);
}

}  // namespace fanout::kernels
