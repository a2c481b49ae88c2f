// Convolution entry points for both ranks: output shape, shape/dtype/device
// checks, then dispatch (CPU oneDNN, CUDA cuDNN); x, y, dy and dx in any
// floating storage and format through staging (roles 0 to 2).
#include "kernels/conv.h"

#include <initializer_list>
#include <string>

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {

using detail::check_grad;
using detail::check_tensor;

// One convolution's rank and geometry, for its checks and messages.
struct ConvSpec {
  const char* family;  // "conv2d" or "conv3d", the prefix of shape errors
  int spatial;         // 2 or 3
  int64_t stride, padding;
};

ConvSpec spec_of(int spatial, const ConvGeometry& g) {
  FANOUT_CHECK(spatial == 2 || spatial == 3) << "convolution over " << spatial << " spatial axes (2 or 3)";
  return {spatial == 2 ? "conv2d" : "conv3d", spatial, g.stride, g.padding};
}

// "(N, C, H, W) and (OC, C, KH, KW)" or the 3-D form.
std::string layouts(int spatial) {
  return spatial == 3 ? "(N, C, D, H, W) and (OC, C, KD, KH, KW)" : "(N, C, H, W) and (OC, C, KH, KW)";
}

// "3x3" or "3x3x3": the extents of a shape's trailing spatial axes.
std::string extents(const int64_t* e, int spatial) {
  std::string s;
  for (int a = 0; a < spatial; ++a) s.append(a ? "x" : "").append(std::to_string(e[a]));
  return s;
}

Shape shape_of(const ConvSpec& s, const Shape& x, const Shape& w) {
  const int rank = s.spatial + 2;
  FANOUT_CHECK(x.ndim == rank && w.ndim == rank)
      << s.family << ": x " << x.str() << " and w " << w.str() << " must be " << layouts(s.spatial);
  FANOUT_CHECK(x[1] == w[1]) << s.family << ": x " << x.str() << " has " << x[1] << " channels, w " << w.str()
                             << " expects " << w[1];
  FANOUT_CHECK(s.stride >= 1 && s.padding >= 0)
      << s.family << ": bad stride " << s.stride << " / padding " << s.padding;
  bool empty = w[0] < 1, fits = true;
  int64_t padded[3];
  for (int a = 0; a < s.spatial; ++a) {
    padded[a] = x[2 + a] + 2 * s.padding;
    empty = empty || w[2 + a] < 1;
    fits = fits && padded[a] >= w[2 + a];
  }
  FANOUT_CHECK(!empty) << s.family << ": empty kernel w " << w.str();
  FANOUT_CHECK(fits) << s.family << ": kernel " << extents(w.d.data() + 2, s.spatial) << " larger than padded input "
                     << extents(padded, s.spatial) << " (x " << x.str() << ", padding " << s.padding << ")";
  Shape y = x;
  y[1] = w[0];
  for (int a = 0; a < s.spatial; ++a) y[2 + a] = (padded[a] - w[2 + a]) / s.stride + 1;
  return y;
}

// An activation: float32 contiguous, or with `storage` any floating storage
// in either format (what the CUDA backend reads natively).
void check_activation(const Context& ctx, const char* op, const char* name, const Tensor& t, bool storage) {
  if (storage) detail::check_storage(ctx, op, name, t);
  else check_tensor(ctx, op, name, t);
}

void check_args(const Context& ctx, const char* op, const ConvSpec& s, const Tensor& x, const Tensor& w,
                const Tensor* b, bool b_is_grad, const Tensor& y, const char* y_name, bool storage) {
  check_activation(ctx, op, "x", x, storage);
  check_tensor(ctx, op, "w", w);
  check_activation(ctx, op, y_name, y, storage);
  const Shape ys = shape_of(s, x.shape(), w.shape());
  FANOUT_CHECK(y.shape() == ys) << op << ": " << y_name << " " << y.shape().str() << " but x " << x.shape().str()
                                << ", w " << w.shape().str() << ", stride " << s.stride << ", padding " << s.padding
                                << " give " << ys.str();
  if (b) {
    if (b_is_grad) check_grad(ctx, op, "db", *b);
    else check_tensor(ctx, op, "bias", *b);
    FANOUT_CHECK(b->shape() == Shape{w.size(0)}) << op << ": bias " << b->shape().str() << " for w "
                                                 << w.shape().str();
  }
}

void check_conv_forward(const Context& ctx, const char* op, const ConvSpec& s, const Tensor& x, const Tensor& w,
                        const Tensor* b, const Tensor& y, bool storage = false) {
  check_args(ctx, op, s, x, w, b, false, y, "y", storage);
}

void check_conv_backward(const Context& ctx, const char* op, const ConvSpec& s, const Tensor& x, const Tensor& w,
                         const Tensor& dy, const Tensor* dx, const Tensor& dw, const Tensor* db,
                         bool storage = false) {
  check_args(ctx, op, s, x, w, db, true, dy, "dy", storage);
  if (dw.defined()) {  // undefined: the weight gradient is not wanted (a transposed convolution's forward)
    check_grad(ctx, op, "dw", dw);
    FANOUT_CHECK(dw.shape() == w.shape()) << op << ": dw " << dw.shape().str() << " for w " << w.shape().str();
    FANOUT_CHECK(!db || db->dtype() == dw.dtype())
        << op << ": dw is " << dtype_name(dw.dtype()) << " but db is " << dtype_name(db->dtype());
  }
  if (dx) {
    check_activation(ctx, op, "dx", *dx, storage);
    FANOUT_CHECK(dx->shape() == x.shape()) << op << ": dx " << dx->shape().str() << " for x " << x.shape().str();
  }
}

}  // namespace

Shape conv_output_shape(int spatial, const Shape& x, const Shape& w, const ConvGeometry& g) {
  return shape_of(spec_of(spatial, g), x, w);
}

bool conv_rounds_in_low_type(const Context& ctx) {
  if (ctx.math.autocast == DType::F32) return false;
  FANOUT_DISPATCH(ctx, conv_rounds_in_low_type, ctx);
}

namespace {
// Backends that round in the low type read and write activations stored in
// the autocast type in either layout themselves (cuDNN and oneDNN in that
// type; CUDA's bias kernels on any storage: kernels/cuda/conv.cu); each
// activation must be that or float32 contiguous. Everything else is staged.
bool native_storage(const Context& ctx, std::initializer_list<const Tensor*> activations) {
  if (!conv_rounds_in_low_type(ctx)) return false;
  for (const Tensor* t : activations)
    if (t && !detail::plain_f32(*t) && t->dtype() != ctx.math.autocast) return false;
  return true;
}

// The CPU's float32 kernels read and write activations in either format
// (oneDNN reorders them into its layout as it reads them anyway), so their
// staged copies keep the stored format: widening a channels-last low-type
// activation then moves nothing. CUDA's stage into contiguous tensors.
bool cpu_keeps_format(const Context& ctx) { return ctx.device().is_cpu(); }
}  // namespace

void conv_forward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor* b, const ConvGeometry& g,
                  Tensor& y) {
  const ConvSpec s = spec_of(spatial, g);
  const char* op = spatial == 2 ? "conv2d_forward" : "conv3d_forward";
  if (native_storage(ctx, {&x, &y})) {
    check_conv_forward(ctx, op, s, x, w, b, y, /*storage=*/true);
    FANOUT_DISPATCH(ctx, conv_forward, ctx, spatial, x, w, b, g, y);
  }
  const bool keep = cpu_keeps_format(ctx);
  const Tensor xs = detail::staged_in(ctx, op, "x", 0, x, keep);
  Tensor ys = detail::staged_out(ctx, op, "y", 2, y, false, keep);
  check_conv_forward(ctx, op, s, xs, w, b, ys, keep);
  FANOUT_CALL_BACKEND(ctx, conv_forward, ctx, spatial, xs, w, b, g, ys);
  detail::unstage(ctx, ys, y);
}

void conv_backward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor& dy,
                   const ConvGeometry& g, Tensor* dx, Tensor& dw, Tensor* db) {
  const ConvSpec s = spec_of(spatial, g);
  const char* op = spatial == 2 ? "conv2d_backward" : "conv3d_backward";
  if (native_storage(ctx, {&x, &dy, dx})) {
    check_conv_backward(ctx, op, s, x, w, dy, dx, dw, db, /*storage=*/true);
    FANOUT_DISPATCH(ctx, conv_backward, ctx, spatial, x, w, dy, g, dx, dw, db);
  }
  const bool keep = cpu_keeps_format(ctx);
  const Tensor xs = detail::staged_in(ctx, op, "x", 0, x, keep), dys = detail::staged_in(ctx, op, "dy", 1, dy, keep);
  Tensor dxs = dx ? detail::staged_out(ctx, op, "dx", 2, *dx, false, keep) : Tensor();
  check_conv_backward(ctx, op, s, xs, w, dys, dx ? &dxs : nullptr, dw, db, keep);
  FANOUT_CALL_BACKEND(ctx, conv_backward, ctx, spatial, xs, w, dys, g, dx ? &dxs : nullptr, dw, db);
  if (dx) detail::unstage(ctx, dxs, *dx);
}

}  // namespace fanout::kernels
