// CPU elementwise arithmetic: contiguous loops that g++ -O3 vectorizes.
#include "kernels/elementwise.h"

#include "kernels/cpu/loops.h"

namespace fanout::kernels::cpu {

void add(Context&, const Tensor& a, const Tensor& b, Tensor& out) {
  // out may alias a or b.
  map2(a.f32(), b.f32(), out.f32(), out.numel(), [](float u, float v) { return u + v; });
}

void axpy(Context&, float alpha, const Tensor& x, Tensor& y) {
  // y += alpha * x; x == y gives y *= 1 + alpha, as the formula says.
  map2(x.f32(), y.f32(), y.f32(), y.numel(), [alpha](float u, float v) { return v + alpha * u; });
}

void scale(Context&, float alpha, Tensor& x) {
  float* xp = x.f32();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) xp[i] *= alpha;
}

}  // namespace fanout::kernels::cpu
