// Helpers shared by the public kernel entry points: precondition checks on
// tensors and the error thrown when a device has no backend for an op.
// Public entry points check, then FANOUT_DISPATCH: CPU -> cpu::op, CUDA ->
// cuda::op (only in a build with FANOUT_WITH_CUDA), anything else -> no_backend().
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// No silent fallback: an op reaching a device it has no backend for throws.
[[noreturn]] inline void no_backend(const char* op, Device d) {
  FANOUT_FAIL() << op << ": no backend for device " << d.str() << " in this build of fanout";
}

// `return`s op's backend for the context's device, called with the remaining
// arguments; the one place that knows which backends this build has.
#ifdef FANOUT_WITH_CUDA
#define FANOUT_DISPATCH(ctx, op, ...)                                       \
  do {                                                                      \
    if ((ctx).device().is_cpu()) return cpu::op(__VA_ARGS__);               \
    if ((ctx).device().is_cuda()) return cuda::op(__VA_ARGS__);             \
    ::fanout::kernels::no_backend(#op, (ctx).device());                     \
  } while (0)
#else
#define FANOUT_DISPATCH(ctx, op, ...)                                       \
  do {                                                                      \
    if ((ctx).device().is_cpu()) return cpu::op(__VA_ARGS__);               \
    ::fanout::kernels::no_backend(#op, (ctx).device());                     \
  } while (0)
#endif

namespace detail {

// Throws unless `t` is defined, has dtype `dt` and lives in the memory of the
// context's device. All CPU devices share host memory, so a cpu:1 context
// accepts a cpu:0 tensor (the DP engine hands CPU chunks over in place); a
// CUDA context needs the same CUDA device.
inline void check_tensor(const Context& ctx, const char* op, const char* name, const Tensor& t,
                         DType dt = DType::F32) {
  FANOUT_CHECK(t.defined()) << op << ": " << name << " is undefined";
  FANOUT_CHECK(t.dtype() == dt) << op << ": " << name << " " << t.shape().str() << " must be " << dtype_name(dt)
                                << ", got " << dtype_name(t.dtype());
  FANOUT_CHECK(t.device().same_memory(ctx.device()))
      << op << ": " << name << " " << t.shape().str() << " is on " << t.device().str() << " but the context is on "
      << ctx.device().str();
  FANOUT_CHECK(!t.channels_last()) << op << ": " << name << " " << t.shape().str()
                                   << " is channels-last; this op reads contiguous tensors";
}

// A tensor of an op that reads and writes any floating storage: defined,
// float32, bfloat16 or float16 (computed in float32), in either memory
// format, in the memory of the context's device.
inline void check_storage(const Context& ctx, const char* op, const char* name, const Tensor& t) {
  FANOUT_CHECK(t.defined()) << op << ": " << name << " is undefined";
  const DType d = t.dtype();
  FANOUT_CHECK(d == DType::F32 || d == DType::BF16 || d == DType::F16)
      << op << ": " << name << " " << t.shape().str() << " must be float32, bfloat16 or float16, got "
      << dtype_name(d);
  FANOUT_CHECK(t.device().same_memory(ctx.device()))
      << op << ": " << name << " " << t.shape().str() << " is on " << t.device().str() << " but the context is on "
      << ctx.device().str();
}

// Tensors an elementwise op pairs element by element: the same shape and
// format (contiguous ones of equal numel also pair, whatever their shapes).
inline void check_same_layout(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                              const Tensor& b) {
  const bool ok = a.format() == b.format() && (a.channels_last() ? a.shape() == b.shape() : a.numel() == b.numel());
  FANOUT_CHECK(ok) << op << ": " << a_name << " " << a.shape().str() << " " << memory_format_name(a.format())
                   << " and " << b_name << " " << b.shape().str() << " " << memory_format_name(b.format())
                   << " do not pair element by element";
}

// A gradient being accumulated: float32, or float64 on CPU (exact sums, see
// Module::set_grad_dtype).
inline void check_grad(const Context& ctx, const char* op, const char* name, const Tensor& t) {
  const bool f64 = t.defined() && t.dtype() == DType::F64;
  FANOUT_CHECK(!f64 || ctx.device().is_cpu()) << op << ": float64 " << name << " is supported on CPU only";
  check_tensor(ctx, op, name, t, f64 ? DType::F64 : DType::F32);
}

// A normalization's backward outputs: dx of x's shape beside dy, and the
// gradients of gamma and beta (check_grad, one dtype, gamma's shape).
inline void check_norm_backward(const Context& ctx, const char* op, const Tensor& x, const Tensor& dy,
                                const Tensor& gamma, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  check_tensor(ctx, op, "dy", dy);
  check_tensor(ctx, op, "dx", dx);
  check_grad(ctx, op, "dgamma", dgamma);
  check_grad(ctx, op, "dbeta", dbeta);
  FANOUT_CHECK(dgamma.dtype() == dbeta.dtype()) << op << ": dgamma and dbeta of different dtypes";
  FANOUT_CHECK(dy.shape() == x.shape() && dx.shape() == x.shape() && dgamma.shape() == gamma.shape() &&
               dbeta.shape() == gamma.shape())
      << op << ": dy " << dy.shape().str() << ", dx " << dx.shape().str() << ", dgamma " << dgamma.shape().str()
      << ", dbeta " << dbeta.shape().str() << " for x " << x.shape().str();
}

// Another operand of an elementwise op on floating storage whose first
// operand is `first`: check_storage, first's dtype, and check_same_layout.
inline void check_like(const Context& ctx, const char* op, const char* name, const Tensor& t,
                       const char* first_name, const Tensor& first) {
  check_storage(ctx, op, name, t);
  FANOUT_CHECK(t.dtype() == first.dtype()) << op << ": " << name << " is " << dtype_name(t.dtype()) << " but "
                                           << first_name << " " << dtype_name(first.dtype());
  check_same_layout(op, first_name, first, name, t);
}

}  // namespace detail
}  // namespace fanout::kernels
