// CPU head layout: one memcpy of D elements per (b, h, t), over (b, t) rows in parallel.
#include "kernels/heads.h"

#include <cstring>

#include "kernels/cpu/parallel.h"

namespace fanout::kernels::cpu {

namespace {
// to_rows: rows <- heads; else heads (from position t0) <- rows.
void copy_heads(Context& ctx, const Tensor& rows, int64_t offset, const Tensor& heads, int64_t t0, bool to_rows) {
  const int64_t b = rows.size(0), h = heads.size(1), t = rows.size(1), th = heads.size(2), d = heads.size(3),
                c = rows.size(2);
  const size_t es = dtype_size(heads.dtype()), row_bytes = static_cast<size_t>(d) * es;
  char* r = static_cast<char*>(rows.raw());
  char* hp = static_cast<char*>(heads.raw());
  parallel_for(ctx, b * t, grain_for(h * d), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t bi = bt / t, ti = bt % t;
      for (int64_t hi = 0; hi < h; ++hi) {
        char* rp = r + static_cast<size_t>(bt * c + offset + hi * d) * es;
        char* q = hp + static_cast<size_t>(((bi * h + hi) * th + t0 + ti) * d) * es;
        if (to_rows) std::memcpy(rp, q, row_bytes);
        else std::memcpy(q, rp, row_bytes);
      }
    }
  });
}
}  // namespace

void heads_from_rows(Context& ctx, const Tensor& rows, int64_t offset, Tensor& heads, int64_t t0) {
  copy_heads(ctx, rows, offset, heads, t0, false);
}

void heads_to_rows(Context& ctx, const Tensor& heads, int64_t offset, Tensor& rows) {
  copy_heads(ctx, rows, offset, heads, 0, true);
}

}  // namespace fanout::kernels::cpu
