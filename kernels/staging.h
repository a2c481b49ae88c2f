// Staging for kernel entry points whose backends read and write float32
// contiguous tensors (or float32 in either format: keep_format): they take
// operands in any floating storage (float32, bfloat16, float16) and either
// memory format by converting each operand into the context's staging
// scratch (widening is exact) and each output from it (rounded once to the
// output's type). A float32 tensor the backend reads goes through
// untouched. Backends that read a storage natively skip this.
#pragma once
#include <initializer_list>

#include "kernels/convert.h"
#include "kernels/dispatch.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::detail {

inline bool plain_f32(const Tensor& t) { return t.dtype() == DType::F32 && !t.channels_last(); }

// The float32 tensor an operand is staged as: contiguous, or with
// `keep_format` in the operand's own format (for backends whose float32
// kernels read either: widening then moves nothing).
inline bool staged_as_is(const Tensor& t, bool keep_format) {
  return t.dtype() == DType::F32 && (keep_format || !t.channels_last());
}
inline Tensor staging_for(Context& ctx, int role, const Tensor& t, bool keep_format) {
  return ctx.staging(role, static_cast<size_t>(t.numel()) * sizeof(float))
      .as(t.shape(), DType::F32, keep_format ? t.format() : MemoryFormat::Contiguous);
}

// t as a float32 contiguous tensor (with `keep_format`, a float32 one in
// t's format): t itself, or its values converted into staging role `role`.
// op and name are for the error on a tensor that is not floating storage.
inline Tensor staged_in(Context& ctx, const char* op, const char* name, int role, const Tensor& t,
                        bool keep_format = false) {
  if (staged_as_is(t, keep_format)) return t;
  check_storage(ctx, op, name, t);
  Tensor s = staging_for(ctx, role, t, keep_format);
  convert(ctx, t, s);
  return s;
}

// Where a backend writes an output bound for `out`: out itself, or staging
// role `role` shaped like it (unstage moves it into out); `keep_format` as
// for staged_in. With `accumulate` the staged output starts from out's
// values, for outputs the op adds to.
inline Tensor staged_out(Context& ctx, const char* op, const char* name, int role, const Tensor& out,
                         bool accumulate = false, bool keep_format = false) {
  if (staged_as_is(out, keep_format)) return out;
  check_storage(ctx, op, name, out);
  Tensor s = staging_for(ctx, role, out, keep_format);
  if (accumulate) convert(ctx, out, s);
  return s;
}

// Moves a staged output into out (nothing when it is out).
inline void unstage(Context& ctx, const Tensor& staged, Tensor& out) {
  if (staged.raw() != out.raw()) convert(ctx, staged, out);
}

// Whether the backend takes these operands as they are: CUDA kernels that
// read and write every floating storage natively do, when each operand is
// stored as the first is (dtype and format).
inline bool cuda_alike(const Context& ctx, std::initializer_list<const Tensor*> ts) {
  if (!ctx.device().is_cuda()) return false;
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts)
    if (t->dtype() != first.dtype() || t->format() != first.format()) return false;
  return true;
}

// Whether the backend takes these operands as they are in the ops whose CPU
// kernels also read channels-last rows (batch norm, max pooling): each
// stored as the first (dtype and format), on CUDA in any storage, on the
// CPU in a channels-last one (a float32 contiguous set goes to its plane
// kernels as it is anyway).
inline bool rows_alike(const Context& ctx, std::initializer_list<const Tensor*> ts) {
  if (ctx.device().is_cuda()) return cuda_alike(ctx, ts);
  const Tensor& first = **ts.begin();
  if (!ctx.device().is_cpu() || !first.channels_last()) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != first.dtype() || t->format() != first.format()) return false;
  return true;
}

// An activation's check: float32 contiguous for the backends that stage
// (the CPU), any floating storage on CUDA.
inline void check_activation(const Context& ctx, const char* op, const char* name, const Tensor& t) {
  if (ctx.device().is_cuda()) check_storage(ctx, op, name, t);
  else check_tensor(ctx, op, name, t);
}

// check_activation, and any floating storage for a channels-last tensor on
// the CPU (what rows_alike lets through to its row kernels).
inline void check_activation_or_rows(const Context& ctx, const char* op, const char* name, const Tensor& t) {
  if (t.channels_last()) check_storage(ctx, op, name, t);
  else check_activation(ctx, op, name, t);
}

// An entry point with one input and one output: run(xs, ys) on them as
// float32 contiguous tensors (x staged in role 0, y in role 2), then y stored.
template <class Run>
void with_staged(Context& ctx, const char* op, const char* x_name, const Tensor& x, const char* y_name, Tensor& y,
                 Run&& run) {
  const Tensor xs = staged_in(ctx, op, x_name, 0, x);
  Tensor ys = staged_out(ctx, op, y_name, 2, y);
  run(xs, ys);
  unstage(ctx, ys, y);
}

// with_staged, or run(x, y) on them as they are when cuda_alike.
template <class Run>
void with_staged_unless_alike(Context& ctx, const char* op, const char* x_name, const Tensor& x, const char* y_name,
                              Tensor& y, Run&& run) {
  if (cuda_alike(ctx, {&x, &y})) return run(x, y);
  with_staged(ctx, op, x_name, x, y_name, y, run);
}

// The same with rows_alike.
template <class Run>
void with_staged_unless_rows_alike(Context& ctx, const char* op, const char* x_name, const Tensor& x,
                                   const char* y_name, Tensor& y, Run&& run) {
  if (rows_alike(ctx, {&x, &y})) return run(x, y);
  with_staged(ctx, op, x_name, x, y_name, y, run);
}

}  // namespace fanout::kernels::detail

// FANOUT_DISPATCH without returning from the caller: the entry point goes on
// (to unstage its outputs) after the backend.
#define FANOUT_CALL_BACKEND(ctx, op, ...) [&] { FANOUT_DISPATCH(ctx, op, __VA_ARGS__); }()
