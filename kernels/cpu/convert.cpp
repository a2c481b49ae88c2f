// CPU conversions: runtime/core/half.h element by element.
#include "kernels/convert.h"
#include "runtime/core/half.h"

namespace fanout::kernels::cpu {

void convert(Context&, const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  if (src.dtype() == DType::F32) {
    const float* s = src.f32();
    uint16_t* d = dst.data<uint16_t>();
    if (dst.dtype() == DType::BF16)
      for (int64_t i = 0; i < n; ++i) d[i] = half::bf16_from_float(s[i]);
    else
      for (int64_t i = 0; i < n; ++i) d[i] = half::f16_from_float(s[i]);
    return;
  }
  const uint16_t* s = src.data<uint16_t>();
  float* d = dst.f32();
  if (src.dtype() == DType::BF16)
    for (int64_t i = 0; i < n; ++i) d[i] = half::float_from_bf16(s[i]);
  else
    for (int64_t i = 0; i < n; ++i) d[i] = half::float_from_f16(s[i]);
}

void round_to(Context&, Tensor& x, DType t) {
  float* a = x.f32();
  const int64_t n = x.numel();
  if (t == DType::BF16)
    for (int64_t i = 0; i < n; ++i) a[i] = half::float_from_bf16(half::bf16_from_float(a[i]));
  else
    for (int64_t i = 0; i < n; ++i) a[i] = half::float_from_f16(half::f16_from_float(a[i]));
}

}  // namespace fanout::kernels::cpu
