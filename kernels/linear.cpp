// Public fully connected entry points: shape/dtype/device checks, then dispatch.
#include "kernels/linear.h"

#include "kernels/dispatch.h"

namespace fanout::kernels {

namespace {
// x (N, in), w (out, in), b (out) or null.
void check_linear(const Context& ctx, const char* op, const Tensor& x, const Tensor& w, const Tensor* b,
                  bool b_is_grad = false) {
  detail::check_tensor(ctx, op, "x", x);
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
  check_linear(ctx, "linear_forward", x, w, b);
  detail::check_tensor(ctx, "linear_forward", "y", y);
  FANOUT_CHECK((y.shape() == Shape{x.size(0), w.size(0)}))
      << "linear_forward: y " << y.shape().str() << " for x " << x.shape().str() << " and w " << w.shape().str();
  FANOUT_DISPATCH(ctx, linear_forward, ctx, x, w, b, y);
}

void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                     Tensor* db) {
  const char* op = "linear_backward";
  check_linear(ctx, op, x, w, db, true);
  detail::check_tensor(ctx, op, "dy", dy);
  FANOUT_CHECK((dy.shape() == Shape{x.size(0), w.size(0)}))
      << op << ": dy " << dy.shape().str() << " for x " << x.shape().str() << " and w " << w.shape().str();
  detail::check_grad(ctx, op, "dw", dw);
  FANOUT_CHECK(dw.shape() == w.shape()) << op << ": dw " << dw.shape().str() << " for w " << w.shape().str();
  FANOUT_CHECK(!db || db->dtype() == dw.dtype())
      << op << ": dw is " << dtype_name(dw.dtype()) << " but db is " << dtype_name(db->dtype());
  if (dx) {
    detail::check_tensor(ctx, op, "dx", *dx);
    FANOUT_CHECK(dx->shape() == x.shape()) << op << ": dx " << dx->shape().str() << " for x " << x.shape().str();
  }
  FANOUT_DISPATCH(ctx, linear_backward, ctx, x, w, dy, dx, dw, db);
}

}  // namespace fanout::kernels
