// Public fully connected entry points: shape/dtype/device checks, then
// dispatch; x, y, dy and dx in any floating storage. CUDA takes float32 and
// the autocast type as they are (cuBLAS reads and writes them); other
// storage, and the CPU, go through staging.
#include "kernels/linear.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

#include <initializer_list>

namespace fanout::kernels {

namespace {
// Whether the backend takes these activations as they are: CUDA, when each
// is float32 or of the autocast type, contiguous.
bool native(const Context& ctx, std::initializer_list<const Tensor*> ts) {
  if (!ctx.device().is_cuda()) return false;
  for (const Tensor* t : ts)
    if (t->channels_last() || (t->dtype() != DType::F32 && t->dtype() != ctx.math.autocast)) return false;
  return true;
}
using detail::check_activation;
// x (N, in), w (out, in), b (out) or null.
void check_linear(const Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor* b,
                  bool b_is_grad = false) {
  check_activation(ctx, op, "x", x);
  detail::check_tensor(ctx, op, "w", w);
  FANOUT_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1))
      << op << ": x " << x.shape().str() << " and w " << w.shape().str() << " do not make (N, in) x (out, in)";
  if (b) {
    if (b_is_grad) detail::check_grad(ctx, op, "db", *b);
    else detail::check_tensor(ctx, op, "b", *b);
    FANOUT_CHECK(b->shape() == Shape{w.size(0)}) << op << ": b " << b->shape().str() << " for w " << w.shape().str();
  }
}
}  // namespace

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const bool as_is = native(ctx, {&x, &y});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  Tensor ys = as_is ? y : detail::staged_out(ctx, op, "y", 2, y);
  check_linear(ctx, op, xs, w, b);
  check_activation(ctx, op, "y", ys);
  FANOUT_CHECK((y.shape() == Shape{x.size(0), w.size(0)}))
      << op << ": y " << y.shape().str() << " for x " << x.shape().str() << " and w " << w.shape().str();
  FANOUT_CALL_BACKEND(ctx, linear_forward, ctx, xs, w, b, ys);
  detail::unstage(ctx, ys, y);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const char* op = "linear_backward";
  const bool as_is = native(ctx, {&x, &dy}) && (!dx || native(ctx, {dx}));
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  const Tensor dys = as_is ? dy : detail::staged_in(ctx, op, "dy", 1, dy);
  Tensor dxs = !dx ? Tensor() : as_is ? *dx : detail::staged_out(ctx, op, "dx", 2, *dx);
  check_linear(ctx, op, xs, w, db, true);
  check_activation(ctx, op, "dy", dys);
  FANOUT_CHECK((dy.shape() == Shape{x.size(0), w.size(0)}))
      << op << ": dy " << dy.shape().str() << " for x " << x.shape().str() << " and w " << w.shape().str();
  detail::check_grad(ctx, op, "dw", dw);
  FANOUT_CHECK(dw.shape() == w.shape()) << op << ": dw " << dw.shape().str() << " for w " << w.shape().str();
  FANOUT_CHECK(!db || db->dtype() == dw.dtype())
      << op << ": dw is " << dtype_name(dw.dtype()) << " but db is " << dtype_name(db->dtype());
  if (dx) {
    check_activation(ctx, op, "dx", dxs);
    FANOUT_CHECK(dx->shape() == x.shape()) << op << ": dx " << dx->shape().str() << " for x " << x.shape().str();
  }
  FANOUT_CALL_BACKEND(ctx, linear_backward, ctx, xs, w, dys, dx ? &dxs : nullptr, dw, db);
  if (dx) detail::unstage(ctx, dxs, *dx);
}

}  // namespace fanout::kernels
