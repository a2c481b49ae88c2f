// CPU GEMM through oneDNN's matmul primitive: one plan per shape, strides,
// alpha and beta, kept by the context (kernels/cpu/onednn.h), its scratchpad
// in the context's workspace. Row-major; a transposed operand is the same
// memory read through swapped strides.
#include "kernels/gemm.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>

#include "kernels/cpu/gemm_low.h"
#include "kernels/cpu/onednn.h"
#include "runtime/core/error.h"

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
memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool trans,
                    memory::data_type t = memory::data_type::f32) {
  return memory::desc({rows, cols}, t, trans ? memory::dims{1, ld} : memory::dims{ld, 1});
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

namespace {

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::F32: return memory::data_type::f32;
    case DType::BF16: return memory::data_type::bf16;
    case DType::F16: return memory::data_type::f16;
    default: FANOUT_FAIL() << "no oneDNN matmul over " << dtype_name(t);
  }
}

struct LowGemmPlan : dn::Plan {
  dnnl::matmul prim;
  memory a, b, bias, c, scratch;
  size_t bytes = 0;
};

// A (m, k) x B (k, n) -> C (m, n) in these types, with a float32 bias row
// (n values) when asked and C's old values added when accumulating.
dnnl::matmul::primitive_desc low_pd(const dnnl::engine& e, const memory::desc& ad, const memory::desc& bd,
                                    bool bias, bool accumulate, const memory::desc& cd, int64_t n) {
  dnnl::primitive_attr attr = dn::user_scratchpad();
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  const memory::desc biasd = bias ? memory::desc({1, n}, memory::data_type::f32, memory::dims{n, 1}) : memory::desc();
  return dn::make_pd<dnnl::matmul>(e, attr, ad, bd, biasd, cd);
}

}  // namespace

bool low_gemm_native(DType t) {
  if (t != DType::BF16 && t != DType::F16) return false;
  static std::once_flag once[2];
  static bool native[2] = {false, false};
  const int i = t == DType::BF16 ? 0 : 1;
  std::call_once(once[i], [&] {
    try {
      const dnnl::engine e(dnnl::engine::kind::cpu, 0);
      const memory::data_type dt = dnnl_type(t);
      const auto m = [&](bool trans) { return matrix(64, 64, 64, trans, dt); };
      // The linear layers' three products: y = x W^T + b, dx = dy W, dW = dy^T x.
      const dnnl::matmul::primitive_desc pds[] = {low_pd(e, m(false), m(true), true, false, m(false), 64),
                                                  low_pd(e, m(false), m(false), false, false, m(false), 64),
                                                  low_pd(e, m(true), m(false), false, false, m(false), 64)};
      // Kernels generated for the instruction set: not oneDNN's reference
      // loops nor its gemm-based fallbacks (emulated on CPUs without the
      // type's dot products), both slower than the float32 path.
      native[i] = true;
      for (const auto& pd : pds) {
        const std::string impl = pd.impl_info_str();
        native[i] = native[i] && impl.rfind("ref", 0) != 0 && impl.rfind("gemm", 0) != 0;
      }
    } catch (const dnnl::error&) {
      native[i] = false;  // no implementation for the type on this CPU
    }
  });
  return native[i];
}

void gemm_low(Context& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, DType ab, const void* a,
              int64_t lda, const void* b, int64_t ldb, const float* bias, bool accumulate, void* c, DType c_type,
              int64_t ldc) {
  FANOUT_CHECK((ab == DType::BF16 || ab == DType::F16) && (c_type == DType::F32 || c_type == ab))
      << "gemm_low: " << dtype_name(ab) << " operands into " << dtype_name(c_type);
  if (m == 0 || n == 0) return;
  FANOUT_CHECK(k > 0) << "gemm_low: an empty product";
  dn::State& s = dn::state(ctx);
  dn::Key key;
  key << dn::kGemmLow << trans_a << trans_b << m << n << k << lda << ldb << ldc << static_cast<int64_t>(ab)
      << static_cast<int64_t>(c_type) << (bias != nullptr) << accumulate << onednn_threads(ctx);
  LowGemmPlan& p = s.plan<LowGemmPlan>(key, [&] {
    auto q = std::make_unique<LowGemmPlan>();
    const auto pd = low_pd(s.engine, matrix(m, k, lda, trans_a, dnnl_type(ab)), matrix(k, n, ldb, trans_b, dnnl_type(ab)),
                           bias != nullptr, accumulate, matrix(m, n, ldc, false, dnnl_type(c_type)), n);
    q->a = dn::unbound(pd.src_desc(), s.engine);
    q->b = dn::unbound(pd.weights_desc(), s.engine);
    if (bias) q->bias = dn::unbound(pd.bias_desc(), s.engine);
    q->c = dn::unbound(pd.dst_desc(), s.engine);
    q->scratch = dn::unbound(pd.scratchpad_desc(), s.engine);
    q->bytes = pd.scratchpad_desc().get_size();
    q->prim = dnnl::matmul(pd);
    return q;
  });
  dn::bind(p.a, a);
  dn::bind(p.b, b);
  dn::bind(p.c, c);
  dn::bind(p.scratch, p.bytes ? ctx.workspace(p.bytes) : nullptr);
  if (bias) {
    dn::bind(p.bias, bias);
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.a}, {DNNL_ARG_WEIGHTS, &p.b}, {DNNL_ARG_BIAS, &p.bias},
                            {DNNL_ARG_DST, &p.c}, {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  } else {
    dn::execute(s, p.prim, {{DNNL_ARG_SRC, &p.a}, {DNNL_ARG_WEIGHTS, &p.b}, {DNNL_ARG_DST, &p.c},
                            {DNNL_ARG_SCRATCHPAD, &p.scratch}});
  }
}

}  // namespace fanout::kernels::cpu
