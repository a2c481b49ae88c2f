// Public batch-normalization entry points: shape/dtype/device checks, then
// dispatch; x, y, dy and dx in any floating storage and format. CUDA reads
// and writes them natively when they share one storage (dtype and format),
// the CPU when they share one channels-last storage (its row kernels);
// otherwise they go through staging (roles 0 to 4).
#include "kernels/batchnorm.h"

#include <utility>

#include "kernels/dispatch.h"
#include "kernels/staging.h"

namespace fanout::kernels {

namespace {
// x (N, C, ...) with at least 2 dims; returns C. Float32 contiguous, or any
// floating storage where the backend takes it natively (channels-last on
// the CPU).
int64_t check_bn_input(const Context& ctx, const char* op, const char* name, const Tensor& x) {
  detail::check_activation_or_rows(ctx, op, name, x);
  FANOUT_CHECK(x.dim() >= 2) << op << ": " << name << " " << x.shape().str() << " must be (N, C, ...)";
  return x.size(1);
}
// A per-channel vector (C).
void check_channel_vec(const Context& ctx, const char* op, const char* name, const Tensor& t, int64_t c) {
  detail::check_tensor(ctx, op, name, t);
  FANOUT_CHECK(t.shape() == Shape{c}) << op << ": " << name << " " << t.shape().str() << " for " << c
                                      << " channels";
}
// The (3, C) float64 batch statistics.
void check_batch_stats(const Context& ctx, const char* op, const Tensor& t, int64_t c) {
  detail::check_tensor(ctx, op, "stats", t, DType::F64);
  FANOUT_CHECK((t.shape() == Shape{3, c})) << op << ": stats " << t.shape().str() << " for " << c
                                           << " channels, expected (3, " << c << ")";
}
// (2, C) statistics (gradient sums; the mean as hi, lo).
void check_stats(const Context& ctx, const char* op, const char* name, const Tensor& t, int64_t c) {
  detail::check_tensor(ctx, op, name, t);
  FANOUT_CHECK((t.shape() == Shape{2, c})) << op << ": " << name << " " << t.shape().str() << " for " << c
                                           << " channels, expected (2, " << c << ")";
}
void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  FANOUT_CHECK(a.shape() == b.shape()) << op << ": " << a_name << " " << a.shape().str() << " and " << b_name << " "
                                       << b.shape().str() << " differ";
}
// The backward passes' inputs: x and dy alike, the saved mean (2, C), invstd
// (C) and the gradient sums (2, C); returns C.
int64_t check_backward_inputs(const Context& ctx, const char* op, const Tensor& x, const Tensor& dy,
                              const Tensor& mean, const Tensor& invstd, const Tensor& grad_stats) {
  const int64_t c = check_bn_input(ctx, op, "x", x);
  check_bn_input(ctx, op, "dy", dy);
  check_same_shape(op, "x", x, "dy", dy);
  check_stats(ctx, op, "mean", mean, c);
  check_channel_vec(ctx, op, "invstd", invstd, c);
  check_stats(ctx, op, "grad_stats", grad_stats, c);
  return c;
}
}  // namespace

void bn_stats(Context& ctx, const Tensor& x, Tensor& stats) {
  const Tensor xs = detail::rows_alike(ctx, {&x}) ? x : detail::staged_in(ctx, "bn_stats", "x", 0, x);
  const int64_t c = check_bn_input(ctx, "bn_stats", "x", xs);
  check_batch_stats(ctx, "bn_stats", stats, c);
  FANOUT_DISPATCH(ctx, bn_stats, ctx, xs, stats);
}

void bn_finalize(Context& ctx, const Tensor& stats, int64_t count, float eps, float momentum, Tensor& mean,
                 Tensor& invstd, Tensor* running_mean, Tensor* running_var) {
  const char* op = "bn_finalize";
  FANOUT_CHECK(stats.dim() == 2) << op << ": stats " << stats.shape().str() << " must be (3, C)";
  const int64_t c = stats.size(1);
  check_batch_stats(ctx, op, stats, c);
  FANOUT_CHECK(count >= 1) << op << ": count " << count << " for stats " << stats.shape().str();
  FANOUT_CHECK(eps >= 0.0f && momentum >= 0.0f && momentum <= 1.0f)
      << op << ": eps " << eps << " must be >= 0 and momentum " << momentum << " in [0, 1]";
  check_stats(ctx, op, "mean", mean, c);
  check_channel_vec(ctx, op, "invstd", invstd, c);
  if (running_mean) check_channel_vec(ctx, op, "running_mean", *running_mean, c);
  if (running_var) {
    check_channel_vec(ctx, op, "running_var", *running_var, c);
    FANOUT_USER_CHECK(count > 1) << "batch norm: expected more than 1 value per channel when training (count "
                                 << count << " for stats " << stats.shape().str() << ")";
  }
  FANOUT_DISPATCH(ctx, bn_finalize, ctx, stats, count, eps, momentum, mean, invstd, running_mean, running_var);
}

namespace {
// The forward passes' tensors: x, y alike, and the per-channel gamma and beta; returns C.
int64_t check_forward_io(const Context& ctx, const char* op, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                         const Tensor& y) {
  const int64_t c = check_bn_input(ctx, op, "x", x);
  check_channel_vec(ctx, op, "gamma", gamma, c);
  check_channel_vec(ctx, op, "beta", beta, c);
  check_bn_input(ctx, op, "y", y);
  check_same_shape(op, "x", x, "y", y);
  return c;
}
}  // namespace

void bn_apply(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
              const Tensor& beta, Tensor& y) {
  const char* op = "bn_apply";
  auto run = [&](const Tensor& xs, Tensor& ys) {
    const int64_t c = check_forward_io(ctx, op, xs, gamma, beta, ys);
    check_stats(ctx, op, "mean", mean, c);
    check_channel_vec(ctx, op, "invstd", invstd, c);
    FANOUT_DISPATCH(ctx, bn_apply, ctx, xs, mean, invstd, gamma, beta, ys);
  };
  detail::with_staged_unless_rows_alike(ctx, op, "x", x, "y", y, run);
}

namespace {
// The operands of the forward passes with the add and ReLU: x, z and y
// staged unless the backend takes them as they are (roles 0 to 2), checked; the
// rounding asked for (y's own type when y is stored low).
struct AddReluIo {
  Tensor xs, zs, ys;
  int64_t c;
  DType round;
  const Tensor* z() const { return zs.defined() ? &zs : nullptr; }
};
AddReluIo add_relu_io(Context& ctx, const char* op, const Tensor& x, const Tensor* z, const Tensor& gamma,
                      const Tensor& beta, Tensor& y, DType round) {
  FANOUT_CHECK(round == DType::F32 || round == DType::BF16 || round == DType::F16)
      << op << ": cannot round to " << dtype_name(round);
  AddReluIo io;
  io.round = y.dtype() == DType::BF16 || y.dtype() == DType::F16 ? y.dtype() : round;  // stored low: as stored
  const bool as_is = z ? detail::rows_alike(ctx, {&x, z, &y}) : detail::rows_alike(ctx, {&x, &y});
  io.xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  if (z) io.zs = as_is ? *z : detail::staged_in(ctx, op, "z", 1, *z);
  io.ys = as_is ? y : detail::staged_out(ctx, op, "y", 2, y);
  io.c = check_forward_io(ctx, op, io.xs, gamma, beta, io.ys);
  if (z) {
    check_bn_input(ctx, op, "z", io.zs);
    check_same_shape(op, "x", io.xs, "z", io.zs);
  }
  return io;
}
}  // namespace

void bn_apply_add_relu(Context& ctx, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& gamma,
                       const Tensor& beta, const Tensor* z, Tensor& y, DType round) {
  const char* op = "bn_apply_add_relu";
  AddReluIo io = add_relu_io(ctx, op, x, z, gamma, beta, y, round);
  check_stats(ctx, op, "mean", mean, io.c);
  check_channel_vec(ctx, op, "invstd", invstd, io.c);
  FANOUT_CALL_BACKEND(ctx, bn_apply_add_relu, ctx, io.xs, mean, invstd, gamma, beta, io.z(), io.ys, io.round);
  detail::unstage(ctx, io.ys, y);
}

namespace {
// An optional bit mask of x's elements: U8, ceil(numel / 8) bytes at least, on the context's device.
void check_relu_mask(const Context& ctx, const char* op, const Tensor* mask, const Tensor& x) {
  if (!mask) return;
  detail::check_tensor(ctx, op, "relu_mask", *mask, DType::U8);
  FANOUT_CHECK(mask->numel() >= (x.numel() + 7) / 8)
      << op << ": relu_mask of " << mask->numel() << " bytes cannot hold a bit for each of x's " << x.numel()
      << " elements";
}
}  // namespace

int64_t bn_relu_mask_bytes(const Context& ctx, const Tensor& x) {
  detail::check_storage(ctx, "bn_relu_mask_bytes", "x", x);  // any floating storage: a size query
  FANOUT_DISPATCH(ctx, bn_relu_mask_bytes, ctx, x);
}

bool bn_train_add_relu(Context& ctx, const Tensor& x, const Tensor* z, const Tensor& gamma, const Tensor& beta,
                       float eps, float momentum, Tensor& stats, Tensor& mean, Tensor& invstd,
                       Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor* relu_mask, DType round) {
  const char* op = "bn_train_add_relu";
  FANOUT_CHECK(eps >= 0.0f && momentum >= 0.0f && momentum <= 1.0f)
      << op << ": eps " << eps << " must be >= 0 and momentum " << momentum << " in [0, 1]";
  AddReluIo io = add_relu_io(ctx, op, x, z, gamma, beta, y, round);
  const int64_t c = io.c;
  check_batch_stats(ctx, op, stats, c);
  check_stats(ctx, op, "mean", mean, c);
  check_channel_vec(ctx, op, "invstd", invstd, c);
  check_channel_vec(ctx, op, "running_mean", running_mean, c);
  check_channel_vec(ctx, op, "running_var", running_var, c);
  const int64_t count = c == 0 ? 0 : io.xs.numel() / c;
  FANOUT_USER_CHECK(count > 1) << "batch norm: expected more than 1 value per channel when training (input "
                               << x.shape().str() << ")";
  check_relu_mask(ctx, op, relu_mask, x);
  const bool mask_written = FANOUT_CALL_BACKEND(ctx, bn_train_add_relu, ctx, io.xs, io.z(), gamma, beta, eps, momentum,
                                                stats, mean, invstd, running_mean, running_var, io.ys, relu_mask,
                                                io.round);
  detail::unstage(ctx, io.ys, y);
  return mask_written;
}

void bn_forward_eval(Context& ctx, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                     const Tensor& gamma, const Tensor& beta, float eps, Tensor& y) {
  const char* op = "bn_forward_eval";
  FANOUT_CHECK(eps >= 0.0f) << op << ": eps " << eps << " must be >= 0";
  auto run = [&](const Tensor& xs, Tensor& ys) {
    const int64_t c = check_forward_io(ctx, op, xs, gamma, beta, ys);
    check_channel_vec(ctx, op, "running_mean", running_mean, c);
    check_channel_vec(ctx, op, "running_var", running_var, c);
    FANOUT_DISPATCH(ctx, bn_forward_eval, ctx, xs, running_mean, running_var, gamma, beta, eps, ys);
  };
  detail::with_staged_unless_rows_alike(ctx, op, "x", x, "y", y, run);
}

void bn_backward_reduce(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                        Tensor& grad_stats) {
  const char* op = "bn_backward_reduce";
  const bool as_is = detail::rows_alike(ctx, {&x, &dy});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  const Tensor dys = as_is ? dy : detail::staged_in(ctx, op, "dy", 1, dy);
  check_backward_inputs(ctx, op, xs, dys, mean, invstd, grad_stats);
  FANOUT_DISPATCH(ctx, bn_backward_reduce, ctx, xs, dys, mean, invstd, grad_stats);
}

void bn_backward_reduce_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                             const Tensor& invstd, Tensor& grad_stats, Tensor& g) {
  const char* op = "bn_backward_reduce_relu";
  const bool as_is = detail::rows_alike(ctx, {&x, &y, &dy, &g});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  const Tensor ys = as_is ? y : detail::staged_in(ctx, op, "y", 1, y);
  const Tensor dys = as_is ? dy : detail::staged_in(ctx, op, "dy", 3, dy);
  Tensor gs = as_is ? g : detail::staged_out(ctx, op, "g", 2, g);
  check_backward_inputs(ctx, op, xs, dys, mean, invstd, grad_stats);
  check_bn_input(ctx, op, "y", ys);
  check_same_shape(op, "x", xs, "y", ys);
  check_bn_input(ctx, op, "g", gs);
  check_same_shape(op, "x", xs, "g", gs);
  FANOUT_CALL_BACKEND(ctx, bn_backward_reduce_relu, ctx, xs, ys, dys, mean, invstd, grad_stats, gs);
  detail::unstage(ctx, gs, g);
}

void bn_backward_relu(Context& ctx, const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& mean,
                      const Tensor& invstd, const Tensor& gamma, const Tensor* relu_mask, Tensor& grad_stats,
                      Tensor& g, Tensor& dx) {
  const char* op = "bn_backward_relu";
  const bool as_is = detail::rows_alike(ctx, {&x, &y, &dy, &g, &dx});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  const Tensor ys = as_is ? y : detail::staged_in(ctx, op, "y", 1, y);
  const Tensor dys = as_is ? dy : detail::staged_in(ctx, op, "dy", 3, dy);
  Tensor gs = as_is ? g : detail::staged_out(ctx, op, "g", 2, g);
  Tensor dxs = as_is ? dx : detail::staged_out(ctx, op, "dx", 4, dx);
  const int64_t c = check_backward_inputs(ctx, op, xs, dys, mean, invstd, grad_stats);
  check_channel_vec(ctx, op, "gamma", gamma, c);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"y", &ys}, {"g", &gs}, {"dx", &dxs}}) {
    check_bn_input(ctx, op, name, *t);
    check_same_shape(op, "x", xs, name, *t);
  }
  FANOUT_CHECK(dx.raw() != dy.raw() && dx.raw() != g.raw()) << op << ": dx must not share dy's or g's memory";
  check_relu_mask(ctx, op, relu_mask, x);
  FANOUT_CALL_BACKEND(ctx, bn_backward_relu, ctx, xs, ys, dys, mean, invstd, gamma, relu_mask, grad_stats, gs, dxs);
  detail::unstage(ctx, gs, g);
  detail::unstage(ctx, dxs, dx);
}

void bn_backward_apply(Context& ctx, const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& invstd,
                       const Tensor& gamma, const Tensor& grad_stats, int64_t count, Tensor& dx) {
  const char* op = "bn_backward_apply";
  const bool as_is = detail::rows_alike(ctx, {&x, &dy, &dx});
  const Tensor xs = as_is ? x : detail::staged_in(ctx, op, "x", 0, x);
  const Tensor dys = as_is ? dy : detail::staged_in(ctx, op, "dy", 1, dy);
  Tensor dxs = as_is ? dx : detail::staged_out(ctx, op, "dx", 2, dx);
  const int64_t c = check_backward_inputs(ctx, op, xs, dys, mean, invstd, grad_stats);
  check_channel_vec(ctx, op, "gamma", gamma, c);
  FANOUT_CHECK(count >= 1) << op << ": count " << count << " for x " << x.shape().str();
  check_bn_input(ctx, op, "dx", dxs);
  check_same_shape(op, "x", xs, "dx", dxs);
  FANOUT_CALL_BACKEND(ctx, bn_backward_apply, ctx, xs, dys, mean, invstd, gamma, grad_stats, count, dxs);
  detail::unstage(ctx, dxs, dx);
}

}  // namespace fanout::kernels
