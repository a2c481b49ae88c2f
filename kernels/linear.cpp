// Public fully connected entry points: shape/dtype/device checks, then
// dispatch; x, y, dy and dx in any floating storage. CUDA, and the CPU when
// it rounds in the low type, take float32 and the autocast type as they are
// (cuBLAS and oneDNN read and write them); other storage, and the CPU's
// float32 kernels, go through staging.
#include "kernels/linear.h"

#include "kernels/dispatch.h"
#include "kernels/staging.h"

#include <initializer_list>

namespace fanout::kernels {

namespace {
// Whether the backend takes these activations as they are: CUDA, or a CPU
// that rounds in the low type, when each is float32 or of the autocast type,
// contiguous.
bool native(const Context& ctx, std::initializer_list<const Tensor*> ts) {
  if (!ctx.device().is_cuda() && !linear_rounds_in_low_type(ctx)) return false;
  for (const Tensor* t : ts)
    if (t->channels_last() || (t->dtype() != DType::F32 && t->dtype() != ctx.math.autocast)) return false;
  return true;
}
// An activation the backend gets: any floating storage when it takes them
// as they are, else what check_activation allows.
void check_activation(const Context& ctx, const char* op, const char* name, const Tensor& t, bool as_is) {
  if (as_is) detail::check_storage(ctx, op, name, t);
  else detail::check_activation(ctx, op, name, t);
}
// x (N, in), w (out, in), b (out) or null.
void check_linear(const Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor* b, bool as_is,
                  bool b_is_grad = false) {
  check_activation(ctx, op, "x", x, as_is);
  // w float32, or already in the low type where the kernels round in it (the layer's one cast a step).
  detail::check_tensor(ctx, op, "w", w,
                       w.dtype() != DType::F32 && linear_rounds_in_low_type(ctx) ? ctx.math.autocast : DType::F32);
  FANOUT_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1))
      << op << ": x " << x.shape().str() << " and w " << w.shape().str() << " do not make (N, in) x (out, in)";
  if (b) {
    if (b_is_grad) detail::check_grad(ctx, op, "db", *b);
    else detail::check_tensor(ctx, op, "b", *b);
    FANOUT_CHECK(b->shape() == Shape{w.size(0)}) << op << ": b " << b->shape().str() << " for w " << w.shape().str();
  }
}
}  // namespace

bool linear_rounds_in_low_type(const Context& ctx) {
  if (ctx.math.autocast == DType::F32) return false;
  FANOUT_DISPATCH(ctx, linear_rounds_in_low_type, ctx);
}

void linear_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const char* op = "linear_forward";
  const bool as_is = native(ctx, {&x, &y});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  Tensor ys = as_is ? y : detail::staged_out(ctx, op, "y", 2, y);
  check_linear(ctx, op, xs, w, b, as_is);
  check_activation(ctx, op, "y", ys, as_is);
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
  check_linear(ctx, op, xs, w, db, as_is, true);
  check_activation(ctx, op, "dy", dys, as_is);
  FANOUT_CHECK((dy.shape() == Shape{x.size(0), w.size(0)}))
      << op << ": dy " << dy.shape().str() << " for x " << x.shape().str() << " and w " << w.shape().str();
  detail::check_grad(ctx, op, "dw", dw);
  FANOUT_CHECK(dw.shape() == w.shape()) << op << ": dw " << dw.shape().str() << " for w " << w.shape().str();
  FANOUT_CHECK(!db || db->dtype() == dw.dtype())
      << op << ": dw is " << dtype_name(dw.dtype()) << " but db is " << dtype_name(db->dtype());
  if (dx) {
    check_activation(ctx, op, "dx", dxs, as_is);
    FANOUT_CHECK(dx->shape() == x.shape()) << op << ": dx " << dx->shape().str() << " for x " << x.shape().str();
  }
  FANOUT_CALL_BACKEND(ctx, linear_backward, ctx, xs, w, dys, dx ? &dxs : nullptr, dw, db);
  if (dx) detail::unstage(ctx, dxs, *dx);
}

}  // namespace fanout::kernels
