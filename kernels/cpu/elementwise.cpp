// CPU elementwise arithmetic: contiguous loops that g++ -O3 vectorizes.
#include "kernels/cpu/elementwise.h"

namespace fanout::kernels::cpu {

void add(Context&, const Tensor& a, const Tensor& b, Tensor& out) {
  const float* ap = a.f32();
  const float* bp = b.f32();
  float* op = out.f32();  // may alias ap or bp
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) op[i] = ap[i] + bp[i];
}

void axpy(Context&, float alpha, const Tensor& x, Tensor& y) {
  const float* xp = x.f32();
  float* yp = y.f32();
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) yp[i] += alpha * xp[i];
}

void scale(Context&, float alpha, Tensor& x) {
  float* xp = x.f32();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) xp[i] *= alpha;
}

}  // namespace fanout::kernels::cpu
