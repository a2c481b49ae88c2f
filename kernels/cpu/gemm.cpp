// CPU GEMM through oneDNN's matmul primitive: one plan per shape, strides,
// alpha and beta, kept by the context (kernels/cpu/onednn.h), its scratchpad
// in the context's workspace. Row-major; a transposed operand is the same
// memory read through swapped strides.
#include "kernels/gemm.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/onednn.h"

namespace fanout::kernels::cpu {

namespace {

namespace dn = onednn;
using dnnl::memory;

struct GemmPlan : dn::Plan {
  dnnl::matmul prim;
  memory a, b, c, scratch;
  size_t bytes = 0;
};

// (rows, cols) read from row-major storage with leading dimension ld,
// transposed when `trans`.
memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool trans) {
  return memory::desc({rows, cols}, memory::data_type::f32, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
}


// A float's bits, for a plan's key.
uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

// C = alpha * A B + beta * C as one oneDNN matmul over these descriptors.
std::unique_ptr<GemmPlan> make_plan(dn::State& s, float alpha, float beta, const memory::desc& ad,
                                    const memory::desc& bd, const memory::desc& cd) {
  auto q = std::make_unique<GemmPlan>();
  dnnl::primitive_attr attr = dn::user_scratchpad();
  dnnl::post_ops po;
#if FANOUT_DNNL3
  if (alpha != 1.0f) po.append_eltwise(dnnl::algorithm::eltwise_linear, alpha, 0.0f);
#else
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
#endif
  if (beta != 0.0f) po.append_sum(beta);
  attr.set_post_ops(po);
  const auto pd = dn::make_pd<dnnl::matmul>(s.engine, attr, ad, bd, cd);
  q->a = dn::unbound(ad, s.engine);
  q->b = dn::unbound(bd, s.engine);
  q->c = dn::unbound(cd, s.engine);
  q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
  q->bytes = pd.scratchpad_desc().get_size();
  q->prim = dnnl::matmul(pd);
  return q;
}

void run(Context& ctx, dn::State& s, GemmPlan& p, const float* a, const float* b, float* c) {
  dn::bind(p.a, a);
  dn::bind(p.b, b);
  dn::bind(p.c, c);
  dn::bind(p.scratch, p.bytes ? ctx.workspace(p.bytes) : nullptr);
  dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.a}, {DNNL_ARG_WEIGHTS, &p.b}, {DNNL_ARG_DST, &p.c},
                          {DNNL_ARG_SCRATCHPAD, &p.scratch}});
}
}  // namespace

void gemm(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    // C = beta * C; beta == 0 writes zeros even over NaN (BLAS convention).
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.0f) std::fill(row, row + n, 0.0f);
      else if (beta != 1.0f)
        for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
    return;
  }
  dn::State& s = dn::state(ctx);
  dn::Key key;
  key << dn::kGemm << trans_a << trans_b << m << n << k << lda << ldb << ldc << bits(alpha) << bits(beta)
      << onednn_threads(ctx);
  GemmPlan& p = s.plan<GemmPlan>(key, [&] {
    return make_plan(s, alpha, beta, matrix(m, k, lda, trans_a), matrix(k, n, ldb, trans_b), matrix(m, n, ldc, false));
  });
  run(ctx, s, p, a, b, c);
}

namespace {

// (batch, rows, cols): matrix i at i * stride, each as matrix().
memory::desc batched(int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride, bool trans) {
  return memory::desc({batch, rows, cols}, memory::data_type::f32,
                      trans ? memory::dims{stride, 1, ld} : memory::dims{stride, ld, 1});
}
}  // namespace

// One oneDNN matmul with a batch dimension (its strides carry the batch
// strides); the plan is cached per shape like gemm's.
void gemm_strided_batched(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                          int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (k == 0 || alpha == 0.0f || batch == 1) {
    for (int64_t i = 0; i < batch; ++i)
      gemm(ctx, trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
           c + i * stride_c, ldc);
    return;
  }
  dn::State& s = dn::state(ctx);
  dn::Key key;
  key << dn::kGemmStridedBatched << trans_a << trans_b << m << n << k << lda << ldb << ldc << stride_a << stride_b
      << stride_c << batch << bits(alpha) << bits(beta) << onednn_threads(ctx);
  GemmPlan& p = s.plan<GemmPlan>(key, [&] {
    return make_plan(s, alpha, beta, batched(batch, m, k, lda, stride_a, trans_a),
                     batched(batch, k, n, ldb, stride_b, trans_b), batched(batch, m, n, ldc, stride_c, false));
  });
  run(ctx, s, p, a, b, c);
}

}  // namespace fanout::kernels::cpu
