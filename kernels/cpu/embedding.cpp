// CPU embedding: forward copies rows (ids checked as they are read);
// backward sorts (id, position) pairs, packed in one int64 each so that
// std::sort orders them by id, then position, in the context's workspace,
// and sums each id's rows in position order in double before adding them to
// dweight (float64 dweight: per sample, see kernels/embedding.h).
#include "kernels/embedding.h"

#include <algorithm>
#include <cstring>

namespace fanout::kernels::cpu {

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& weight, Tensor& y) {
  const int64_t n = ids.numel(), v = weight.size(0), e = weight.size(1);
  const int32_t* ip = ids.data<int32_t>();  // (N...)
  const float* w = weight.f32();            // (V, E)
  float* yp = y.f32();                      // (N..., E)
  for (int64_t p = 0; p < n; ++p) {
    const int64_t id = ip[p];
    if (id < 0 || id >= v) ::fanout::kernels::detail::embedding_bad_id(ctx, "embedding_forward", ids, p, id, v);
    std::memcpy(yp + p * e, w + id * e, sizeof(float) * static_cast<size_t>(e));
  }
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dy, Tensor& dweight) {
  const int64_t n = ids.numel(), v = dweight.size(0), e = dweight.size(1);
  const int64_t per_sample = n / ids.size(0);
  const int32_t* ip = ids.data<int32_t>();  // (N...)
  const float* g = dy.f32();                // (N..., E)
  const bool exact = dweight.dtype() == DType::F64;
  // [pairs (n) | acc (E)]: id << 32 | position, ids checked first.
  auto* pairs = static_cast<int64_t*>(ctx.workspace(sizeof(int64_t) * static_cast<size_t>(n + e)));
  double* acc = reinterpret_cast<double*>(pairs + n);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t id = ip[p];
    if (id < 0 || id >= v) ::fanout::kernels::detail::embedding_bad_id(ctx, "embedding_backward", ids, p, id, v);
    pairs[p] = id << 32 | p;
  }
  std::sort(pairs, pairs + n);
  auto flush = [&](int64_t id) {
    if (exact) {  // a float per (sample, id), summed exactly whatever the split
      double* d = dweight.f64() + id * e;
      for (int64_t k = 0; k < e; ++k) d[k] += static_cast<float>(acc[k]);
    } else {
      float* d = dweight.f32() + id * e;
      for (int64_t k = 0; k < e; ++k) d[k] += static_cast<float>(acc[k]);
    }
  };
  // Runs of one id (one sample's under float64 dweight), positions ascending.
  for (int64_t b = 0; b < n;) {
    const int64_t id = pairs[b] >> 32;
    int64_t end = b;
    std::fill(acc, acc + e, 0.0);
    for (; end < n && pairs[end] >> 32 == id; ++end) {
      const int64_t p = pairs[end] & 0xffffffff;
      if (exact && end > b && p / per_sample != (pairs[end - 1] & 0xffffffff) / per_sample) {
        flush(id);
        std::fill(acc, acc + e, 0.0);
      }
      const float* r = g + p * e;
      for (int64_t k = 0; k < e; ++k) acc[k] += r[k];
    }
    flush(id);
    b = end;
  }
}

}  // namespace fanout::kernels::cpu
