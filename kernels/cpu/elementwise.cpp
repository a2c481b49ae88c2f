// CPU elementwise arithmetic: contiguous loops that g++ -O3 vectorizes.
#include "kernels/elementwise.h"

#include "kernels/convert.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/storage.h"

namespace fanout::kernels::cpu {

namespace {
FANOUT_AVX2_CLONE void add_rows(const float* a, const float* b, float* out, int64_t n) {
  map2(a, b, out, n, [](float u, float v) { return u + v; });
}
}  // namespace

void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round) {
  // out may alias a or b.
  storage_map2(ctx, a, b, out, 1,
               [](const float* ap, const float* bp, float* op, int64_t n) { add_rows(ap, bp, op, n); });
  if (round != DType::F32) round_to(ctx, out, round);  // a pass after: the vectorized sum stays as it is
}

void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y) {
  // y += alpha * x; x == y gives y *= 1 + alpha, as the formula says.
  const float* xp = x.f32();
  float* yp = y.f32();
  parallel_for(ctx, y.numel(), grain_for(1), [&](int64_t s, int64_t e) {
    map2(xp + s, yp + s, yp + s, e - s, [alpha](float u, float v) { return v + alpha * u; });
  });
}

void scale(Context& ctx, float alpha, Tensor& x) {
  float* xp = x.f32();
  parallel_for(ctx, x.numel(), grain_for(1), [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) xp[i] *= alpha;
  });
}

}  // namespace fanout::kernels::cpu
