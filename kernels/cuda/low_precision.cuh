// The CUDA backend's low-precision path under autocast (ctx.math.autocast =
// BF16 or F16): cuDNN convolutions and cuBLAS GEMMs take their operands in
// the low type, narrowing (rounding) float32 tensors as they read them;
// results come back widened (exact) or added into float32 sums. Kernels
// whose float32 output autocast rounds do it as they write (round_low).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

#include "runtime/core/error.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda::detail {

inline bool low_precision(const Context& ctx) {
  const DType t = ctx.math.autocast;
  FANOUT_CHECK(t == DType::F32 || t == DType::BF16 || t == DType::F16) << "autocast to " << dtype_name(t);
  return t != DType::F32;
}

// An output's rounding to type t (or to the context's autocast type), for
// kernels to apply as they write: 0 keeps float32, 1 rounds to bfloat16, 2 to
// float16 (nearest even).
inline int low_mode(DType t) { return t == DType::BF16 ? 1 : t == DType::F16 ? 2 : 0; }
inline int low_mode(const Context& ctx) { return low_precision(ctx) ? low_mode(ctx.math.autocast) : 0; }
__device__ __forceinline__ float round_low(float v, int mode) {
  if (mode == 1) return __bfloat162float(__float2bfloat16_rn(v));
  if (mode == 2) return __half2float(__float2half_rn(v));
  return v;
}

// Per context, per role (0, 1: inputs; 2: output; 3: output gradient): a
// low-type buffer of at least the shape, grown and never shrunk, so a warm
// step allocates nothing. Valid until the same role is asked for again.
struct LowBuffers : BackendState {
  Tensor slot[4];
};
inline Tensor low_buffer(Context& ctx, int role, const Shape& s) {
  if (!ctx.backend_state()) ctx.set_backend_state(std::make_unique<LowBuffers>());
  auto* b = dynamic_cast<LowBuffers*>(ctx.backend_state());
  FANOUT_CHECK(b) << "the context on " << ctx.device().str() << " holds another backend's state";
  Tensor& t = b->slot[role];
  ensure(t, s, ctx.math.autocast, ctx.device());
  return t;
}

// dst (low type, n elements) = src narrowed; kernels/cuda/convert.cu.
void narrow_into(Context& ctx, const float* src, Tensor& dst, int64_t n);
// dst (float32) += widen(src), over src's elements.
void add_widened(Context& ctx, const Tensor& src, float* dst);

// A float32 tensor's values as a low-type copy in `role`'s buffer.
inline Tensor narrowed(Context& ctx, int role, const Tensor& t) {
  Tensor l = low_buffer(ctx, role, t.shape());
  narrow_into(ctx, t.f32(), l, t.numel());
  return l;
}

}  // namespace fanout::kernels::cuda::detail
