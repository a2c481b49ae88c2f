// CUDA head layout: one thread per element in a grid-stride loop over the
// heads copied (B, H, T, D), T the rows'; consecutive threads touch
// consecutive d in both layouts, so reads and writes coalesce in runs of D.
#include "kernels/heads.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {
template <class I, class E, bool kToRows>
__global__ void heads_kernel(E* rows, E* heads, I h, I t, I th, I t0, I d, I c, I offset, I total) {
  for (I i : detail::grid_stride(total)) {
    const I di = i % d, ti = (i / d) % t, hi = (i / (d * t)) % h, bi = i / (d * t * h);
    const I r = (bi * t + ti) * c + offset + hi * d + di;
    const I k = ((bi * h + hi) * th + t0 + ti) * d + di;
    if (kToRows) rows[r] = heads[k];
    else heads[k] = rows[r];
  }
}

template <bool kToRows>
void copy_heads(Context& ctx, const Tensor& rows, int64_t offset, const Tensor& heads, int64_t t0) {
  const int64_t h = heads.size(1), t = rows.size(1), th = heads.size(2), d = heads.size(3), c = rows.size(2);
  const int64_t total = rows.size(0) * h * t * d;
  const bool wide = dtype_size(heads.dtype()) == 4;
  const int64_t extent = std::max(rows.numel(), heads.numel());
  detail::launch_per_element(ctx, total, extent, [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    if (wide)
      heads_kernel<I, float, kToRows><<<blocks, detail::kThreads, 0, st>>>(
          static_cast<float*>(rows.raw()), static_cast<float*>(heads.raw()), static_cast<I>(h), static_cast<I>(t),
          static_cast<I>(th), static_cast<I>(t0), static_cast<I>(d), static_cast<I>(c), static_cast<I>(offset),
          static_cast<I>(total));
    else
      heads_kernel<I, uint16_t, kToRows><<<blocks, detail::kThreads, 0, st>>>(
          static_cast<uint16_t*>(rows.raw()), static_cast<uint16_t*>(heads.raw()), static_cast<I>(h),
          static_cast<I>(t), static_cast<I>(th), static_cast<I>(t0), static_cast<I>(d), static_cast<I>(c),
          static_cast<I>(offset), static_cast<I>(total));
  });
}
}  // namespace

void heads_from_rows(Context& ctx, const Tensor& rows, int64_t offset, Tensor& heads, int64_t t0) {
  copy_heads<false>(ctx, rows, offset, heads, t0);
}

void heads_to_rows(Context& ctx, const Tensor& heads, int64_t offset, Tensor& rows) {
  copy_heads<true>(ctx, rows, offset, heads, 0);
}

}  // namespace fanout::kernels::cuda
