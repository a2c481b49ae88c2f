// Causal attention on every backend against a naive float64 reference (full
// T x T softmax with the causal mask): forward y and lse, backward dq, dk, dv,
// and backward against central differences of a scalar loss; on CUDA also
// bfloat16 and float16 tensors against the reference on the rounded operands
// (the CPU through float32 staging), printing which path ran
// (cuDNN's fused flash attention or the widened float32 one), and on Hopper
// that cuDNN's fused path is taken for a shape it supports. Decoding over a
// key-value cache (attention_decode) against float64 too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/backend_test_util.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/core/memory.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct Ref {
  std::vector<double> y, lse, dq, dk, dv;
};

// Naive attention in double for q, k, v (BH, T, D) and dy.
Ref naive_attention(const float* q, const float* k, const float* v, const float* dy, int64_t bh, int64_t T,
                    int64_t D, double scale) {
  Ref r;
  r.y.assign(bh * T * D, 0.0);
  r.lse.assign(bh * T, 0.0);
  r.dq.assign(bh * T * D, 0.0);
  r.dk.assign(bh * T * D, 0.0);
  r.dv.assign(bh * T * D, 0.0);
  std::vector<double> s(T * T), p(T * T), dp(T * T);
  for (int64_t h = 0; h < bh; ++h) {
    const int64_t o = h * T * D;
    for (int64_t i = 0; i < T; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += double(q[o + i * D + c]) * k[o + j * D + c];
        s[i * T + j] = j <= i ? scale * d : -std::numeric_limits<double>::infinity();
        m = std::max(m, s[i * T + j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) sum += std::exp(s[i * T + j] - m);
      r.lse[h * T + i] = m + std::log(sum);
      for (int64_t j = 0; j < T; ++j) p[i * T + j] = std::exp(s[i * T + j] - m) / sum;
      for (int64_t c = 0; c < D; ++c) {
        double a = 0;
        for (int64_t j = 0; j < T; ++j) a += p[i * T + j] * v[o + j * D + c];
        r.y[o + i * D + c] = a;
      }
    }
    // dP = dY V^T; dS = P * (dP - rowsum(dP * P)); dQ = scale dS K; dK = scale dS^T Q; dV = P^T dY.
    for (int64_t i = 0; i < T; ++i) {
      double rs = 0;
      for (int64_t j = 0; j < T; ++j) {
        double d = 0;
        for (int64_t c = 0; c < D; ++c) d += double(dy[o + i * D + c]) * v[o + j * D + c];
        dp[i * T + j] = d;
        rs += d * p[i * T + j];
      }
      for (int64_t j = 0; j < T; ++j) {
        const double ds = p[i * T + j] * (dp[i * T + j] - rs);
        for (int64_t c = 0; c < D; ++c) {
          r.dq[o + i * D + c] += scale * ds * k[o + j * D + c];
          r.dk[o + j * D + c] += scale * ds * q[o + i * D + c];
          r.dv[o + j * D + c] += p[i * T + j] * dy[o + i * D + c];
        }
      }
    }
  }
  return r;
}

// A host tensor of type t (BF16 or F16) holding x's values rounded to t; x
// itself becomes those rounded values (the reference's operands).
Tensor to_low(Tensor& x, DType t) {
  Tensor l = Tensor::empty(x.shape(), t);
  auto* o = l.data<uint16_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    o[i] = t == DType::BF16 ? half::bf16_from_float(x.f32()[i]) : half::f16_from_float(x.f32()[i]);
    x.f32()[i] = t == DType::BF16 ? half::float_from_bf16(o[i]) : half::float_from_f16(o[i]);
  }
  return l;
}
// A low-type host tensor widened to float32.
Tensor from_low(const Tensor& l) {
  Tensor x = Tensor::empty(l.shape());
  const auto* in = l.data<uint16_t>();
  for (int64_t i = 0; i < l.numel(); ++i)
    x.f32()[i] = l.dtype() == DType::BF16 ? half::float_from_bf16(in[i]) : half::float_from_f16(in[i]);
  return x;
}
// A low-type output full of NaN.
Tensor nan_low(const Shape& s, DType t) {
  Tensor l = Tensor::empty(s, t);
  std::fill(l.data<uint16_t>(), l.data<uint16_t>() + l.numel(), uint16_t(t == DType::BF16 ? 0x7FC0 : 0x7E00));
  return l;
}
// Random q, k, v, dy (host, rounded to the operand type) and, after forward
// and backward on the backend into poisoned outputs, those outputs widened
// to float32 on the host, with the path each pass took.
struct AttentionRun {
  Tensor q, k, v, g;
  Tensor y, lse, dq, dk, dv;
  float scale = 0;
  const char* fwd_path = nullptr;
  const char* bwd_path = nullptr;
  Ref ref() const {
    const Shape& s = q.shape();
    return naive_attention(q.f32(), k.f32(), v.f32(), g.f32(), s[0] * s[1], s[2], s[3], scale);
  }
};

// The backend's operands and outputs of one run (outputs poisoned).
struct DeviceOperands {
  Tensor q, k, v, g, y, lse, dq, dk, dv;
};

class AttentionOnBackend : public ft::BackendTest {
 protected:
  // Draws a's operands (type dt) and puts them on the backend.
  DeviceOperands operands(AttentionRun& a, const Shape& s, float scale, std::mt19937_64& rng, DType dt) {
    a.scale = scale;
    a.q = ft::random_tensor(s, rng), a.k = ft::random_tensor(s, rng), a.v = ft::random_tensor(s, rng);
    a.g = ft::random_tensor(s, rng);
    const bool low = dt != DType::F32;
    auto in = [&](Tensor& x) { return low ? up(to_low(x, dt)) : up(x); };
    auto out = [&] { return low ? up(nan_low(s, dt)) : poisoned(s); };
    return {in(a.q), in(a.k), in(a.v), in(a.g), out(), poisoned(Shape{s[0], s[1], s[2]}), out(), out(), out()};
  }
  AttentionRun run(const Shape& s, float scale, std::mt19937_64& rng, DType dt = DType::F32) {
    AttentionRun a;
    DeviceOperands d = operands(a, s, scale, rng, dt);
    kernels::attention_forward(ctx(), d.q, d.k, d.v, scale, d.y, d.lse);
    a.fwd_path = kernels::attention_last_path(kernels::AttentionPass::Forward);
    kernels::attention_backward(ctx(), d.q, d.k, d.v, scale, d.y, d.lse, d.g, d.dq, d.dk, d.dv);
    a.bwd_path = kernels::attention_last_path(kernels::AttentionPass::Backward);
    auto host = [&](const Tensor& t) { return dt == DType::F32 ? down(t) : from_low(down(t)); };
    a.y = host(d.y), a.lse = down(d.lse), a.dq = host(d.dq), a.dk = host(d.dk), a.dv = host(d.dv);
    return a;
  }
  // Every output within 1e-5 of the float64 reference (`matches`).
  void expect_matches_reference(const AttentionRun& a, const Ref& r) {
    EXPECT_TRUE(matches(a.y, r.y, 1e-5, 1e-5)) << "y";
    EXPECT_TRUE(matches(a.lse, r.lse, 1e-5, 1e-5)) << "lse";
    EXPECT_TRUE(matches(a.dq, r.dq, 1e-5, 1e-5)) << "dq";
    EXPECT_TRUE(matches(a.dk, r.dk, 1e-5, 1e-5)) << "dk";
    EXPECT_TRUE(matches(a.dv, r.dv, 1e-5, 1e-5)) << "dv";
  }
};
FANOUT_ON_EVERY_BACKEND(AttentionOnBackend);

TEST_P(AttentionOnBackend, ForwardAndBackwardAgainstFloat64) {
  ctx().math.allow_tf32 = false;  // full float32 products on CUDA (TF32 would miss 1e-5)
  std::mt19937_64 rng(31);
  const int64_t B = 1, H = 3;
  for (int64_t T : {1, 7, 64, 256})
    for (int64_t D : {16, 64}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " D=" << D);
      const AttentionRun a = run(Shape{B, H, T, D}, 1.0f / std::sqrt(static_cast<float>(D)), rng);
      expect_matches_reference(a, a.ref());
      EXPECT_GT(ft::l2_norm(a.y), 0.0);
  EXPECT_GT(ft::l2_norm(a.dv), 0.0);
  // With one key the softmax is 1 whatever the score: dk is zero then.
  if (a.dk.size(2) > 1) EXPECT_GT(ft::l2_norm(a.dk), 0.0);
      if (T > 1) EXPECT_GT(ft::l2_norm(a.dq), 0.0);  // T == 1: one key, softmax constant, dq = 0
    }
}

// Worst |got - want| over max(1, max |want|): the measure `matches` bounds.
double worst_error(const Tensor& got, const std::vector<double>& want) {
  double peak = 1, worst = 0;
  for (double v : want) peak = std::max(peak, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got.f32()[i]) - want[i]));
  return worst / peak;
}

// Many heads and few, sizes that leave partial blocks (T not a multiple of 32
// or 64, D not a multiple of 8 or 16) and long rows (T = 1024: the CPU's sums
// over keys run over 16 blocks), against float64; prints the worst error of
// each output.
TEST_P(AttentionOnBackend, ManyHeadsOddSizesAndLongRowsAgainstFloat64) {
  ctx().math.allow_tf32 = false;
  std::mt19937_64 rng(35);
  const int64_t shapes[][4] = {{4, 8, 100, 17}, {2, 16, 130, 80}, {2, 16, 512, 32}, {1, 3, 97, 80}, {1, 3, 256, 64},
                                {1, 2, 1024, 64}};
  for (const auto& sh : shapes) {
    const int64_t B = sh[0], H = sh[1], T = sh[2], D = sh[3];
    SCOPED_TRACE(::testing::Message() << "B=" << B << " H=" << H << " T=" << T << " D=" << D);
    const AttentionRun a = run(Shape{B, H, T, D}, 1.0f / std::sqrt(static_cast<float>(D)), rng);
    const Ref r = a.ref();
    std::printf("B=%lld H=%lld T=%lld D=%lld worst error: y %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
                static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(T),
                static_cast<long long>(D), worst_error(a.y, r.y), worst_error(a.lse, r.lse), worst_error(a.dq, r.dq),
                worst_error(a.dk, r.dk), worst_error(a.dv, r.dv));
    expect_matches_reference(a, r);
  }
}

// loss = sum(g * y): its central differences in q, k and v (double steps on
// float inputs) against backward's dq, dk, dv at a small size.
TEST_P(AttentionOnBackend, BackwardAgainstCentralDifferences) {
  ctx().math.allow_tf32 = false;
  std::mt19937_64 rng(32);
  const Shape s{1, 2, 5, 3};
  const float scale = 0.7f;
  AttentionRun a = run(s, scale, rng);
  Tensor &q = a.q, &k = a.k, &v = a.v, &g = a.g;
  const Tensor &dq = a.dq, &dk = a.dk, &dv = a.dv;
  auto loss = [&] {
    Tensor qq = up(q), kk = up(k), vv = up(v);
    Tensor yy = poisoned(s), ll = poisoned(Shape{1, 2, 5});
    kernels::attention_forward(ctx(), qq, kk, vv, scale, yy, ll);
    const Tensor yh = down(yy);
    double l = 0;
    for (int64_t i = 0; i < yh.numel(); ++i) l += double(g.f32()[i]) * yh.f32()[i];
    return l;
  };
  const double h = 1e-2;
  for (auto [x, dx, name] : {std::tuple{&q, &dq, "dq"}, std::tuple{&k, &dk, "dk"}, std::tuple{&v, &dv, "dv"}}) {
    for (int64_t i = 0; i < x->numel(); ++i) {
      const float x0 = x->f32()[i];
      x->f32()[i] = static_cast<float>(x0 + h);
      const double lp = loss();
      x->f32()[i] = static_cast<float>(x0 - h);
      const double lm = loss();
      x->f32()[i] = x0;
      const double num = (lp - lm) / (2 * h);
      EXPECT_NEAR(dx->f32()[i], num, 2e-3 * std::max(1.0, std::abs(num))) << name << "[" << i << "]";
    }
    EXPECT_GT(ft::l2_norm(*dx), 0.0) << name;
  }
}

// Every element within rtol * max(1e-3, max |want|) of want; NaN fails.
::testing::AssertionResult within_peak(const Tensor& got, const std::vector<double>& want, double rtol) {
  double peak = 1e-3;
  for (double w : want) peak = std::max(peak, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got.f32()[i]) - want[i]);
    if (!(d <= rtol * peak))
      return ::testing::AssertionFailure() << "element " << i << ": " << got.f32()[i] << " vs " << want[i]
                                           << " (tolerance " << rtol * peak << ")";
  }
  return ::testing::AssertionSuccess();
}

// A low-type run's outputs against the float64 reference: y, dq, dk, dv
// within 2e-2 of their largest magnitude, lse (float32) within 1e-4.
void expect_within_peak(const AttentionRun& a) {
  const Ref r = a.ref();
  EXPECT_TRUE(within_peak(a.y, r.y, 2e-2)) << "y";
  EXPECT_TRUE(within_peak(a.lse, r.lse, 1e-4)) << "lse";
  EXPECT_TRUE(within_peak(a.dq, r.dq, 2e-2)) << "dq";
  EXPECT_TRUE(within_peak(a.dk, r.dk, 2e-2)) << "dk";
  EXPECT_TRUE(within_peak(a.dv, r.dv, 2e-2)) << "dv";
  EXPECT_GT(ft::l2_norm(a.y), 0.0);
  EXPECT_GT(ft::l2_norm(a.dv), 0.0);
  // With one key the softmax is 1 whatever the score: dk is zero then.
  if (a.dk.size(2) > 1) EXPECT_GT(ft::l2_norm(a.dk), 0.0);
}

// bfloat16 and float16 q, k, v, dy: y, dq, dk, dv in that type within 2e-2
// of their largest magnitude, lse (float32) within 1e-4, against the float64
// reference on the rounded operands (the CPU stages them to float32).
TEST_P(AttentionOnBackend, LowPrecisionAgainstFloat64) {
  std::mt19937_64 rng(33);
  const int64_t B = 2, H = 2;
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t T : {1, 7, 64, 256})
      for (int64_t D : {16, 64}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " T=" << T << " D=" << D);
        const Shape s{B, H, T, D};
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        const AttentionRun a = run(s, scale, rng, dt);
        const char* fwd_path = a.fwd_path ? a.fwd_path : "?";
        const char* bwd_path = a.bwd_path ? a.bwd_path : "?";
        // Which path ran (cuDNN's fused flash attention or the widened float32
        // one): printed, so a GPU run's log says which one these numbers checked.
        std::printf("[ attention ] %s T=%lld D=%lld: forward %s, backward %s\n", dtype_name(dt),
                    static_cast<long long>(T), static_cast<long long>(D), fwd_path, bwd_path);
        SCOPED_TRACE(::testing::Message() << "forward " << fwd_path << ", backward " << bwd_path);
        expect_within_peak(a);
      }
}

// On a Hopper GPU (compute capability 9.x) cuDNN's fused flash attention
// takes a shape it supports (bfloat16, D = 64, T = 256, B * H = 8) in both
// passes, and its results (lse included: cuDNN's softmax statistics) meet the
// float64 reference on the rounded operands. Elsewhere, or on another GPU, the
// test skips: which shapes cuDNN takes there is its own business, and the
// widened fallback is checked by LowPrecisionAgainstFloat64.
TEST_P(AttentionOnBackend, FusedCudnnPathOnHopper) {
  if (!on_cuda()) GTEST_SKIP() << "CUDA only";
  int major = 0;
  for (const CudaDeviceInfo& info : cuda_device_info())
    if (info.index == dev().index) major = info.major;
  if (major != 9) GTEST_SKIP() << "compute capability " << major << ".x, not Hopper";
  std::mt19937_64 rng(35);
  const DType dt = DType::BF16;
  const int64_t B = 2, H = 4, T = 256, D = 64;
  const AttentionRun a = run(Shape{B, H, T, D}, 0.125f, rng, dt);
  const char *fwd_path = a.fwd_path, *bwd_path = a.bwd_path;
  std::printf("[ attention ] bfloat16 B=%lld H=%lld T=%lld D=%lld on sm_9x: forward %s, backward %s\n",
              static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(T),
              static_cast<long long>(D), fwd_path ? fwd_path : "?", bwd_path ? bwd_path : "?");
  RecordProperty("forward_path", fwd_path ? fwd_path : "?");
  RecordProperty("backward_path", bwd_path ? bwd_path : "?");
  ASSERT_NE(fwd_path, nullptr);
  ASSERT_NE(bwd_path, nullptr);
  EXPECT_STREQ(fwd_path, "cudnn-fused") << "see stderr for cuDNN's refusal";
  EXPECT_STREQ(bwd_path, "cudnn-fused") << "see stderr for cuDNN's refusal";
  expect_within_peak(a);
  EXPECT_GT(ft::l2_norm(a.dq), 0.0);
  // Deterministic (the graph without the atomically added float32 dQ, or the
  // widened path where cuDNN has no such engine): two runs, the same bits.
  ctx().math.deterministic = true;
  std::mt19937_64 r1(37), r2(37);
  const AttentionRun d1 = run(Shape{B, H, T, D}, 0.125f, r1, dt), d2 = run(Shape{B, H, T, D}, 0.125f, r2, dt);
  ctx().math.deterministic = false;
  std::printf("[ attention ] deterministic bfloat16 on sm_9x: forward %s, backward %s\n",
              d1.fwd_path ? d1.fwd_path : "?", d1.bwd_path ? d1.bwd_path : "?");
  expect_within_peak(d1);
  for (const auto& [x, y] : {std::pair{&d1.dq, &d2.dq}, std::pair{&d1.dk, &d2.dk}, std::pair{&d1.dv, &d2.dv}})
    EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0) << "deterministic runs differ";
}

// A NaN query row makes its own outputs NaN and leaves the other rows
// finite, on every backend (the CUDA kernels' empty-row branch must not
// turn a row of NaN scores into zeros).
TEST_P(AttentionOnBackend, NanQueryRowIsNanAlone) {
  std::mt19937_64 rng(38);
  const Shape s{1, 2, 6, 8};
  Tensor hq = ft::random_tensor(s, rng);
  for (int64_t d = 0; d < 8; ++d) hq.f32()[d] = std::numeric_limits<float>::quiet_NaN();  // head 0, query 0
  Tensor q = up(hq), k = up(ft::random_tensor(s, rng)), v = up(ft::random_tensor(s, rng));
  Tensor y = poisoned(s), lse = poisoned(Shape{1, 2, 6});
  kernels::attention_forward(ctx(), q, k, v, 0.3f, y, lse);
  const Tensor hy = down(y), hl = down(lse);
  for (int64_t d = 0; d < 8; ++d) EXPECT_TRUE(std::isnan(hy.f32()[d])) << "y[0, 0, 0, " << d << "]";
  EXPECT_TRUE(std::isnan(hl.f32()[0])) << "lse[0, 0, 0]";
  for (int64_t i = 8; i < s.numel(); ++i) EXPECT_TRUE(std::isfinite(hy.f32()[i])) << "y element " << i;
  for (int64_t i = 1; i < 12; ++i) EXPECT_TRUE(std::isfinite(hl.f32()[i])) << "lse element " << i;
}

// The path record: float32 on CPU says "cpu"; on CUDA "cuda-float32".
TEST_P(AttentionOnBackend, RecordsThePathTaken) {
  std::mt19937_64 rng(36);
  const Shape s{1, 2, 8, 16};
  Tensor q = up(ft::random_tensor(s, rng)), y = up(Tensor::zeros(s)), lse = up(Tensor::zeros(Shape{1, 2, 8}));
  Tensor dq = up(Tensor::zeros(s)), dk = up(Tensor::zeros(s)), dv = up(Tensor::zeros(s));
  kernels::attention_forward(ctx(), q, q, q, 0.25f, y, lse);
  kernels::attention_backward(ctx(), q, q, q, 0.25f, y, lse, q, dq, dk, dv);
  const char* want = on_cuda() ? "cuda-float32" : "cpu";
  EXPECT_STREQ(kernels::attention_last_path(kernels::AttentionPass::Forward), want);
  EXPECT_STREQ(kernels::attention_last_path(kernels::AttentionPass::Backward), want);
  down(dv);
}

// A second call at the same sizes allocates nothing (the CUDA backend's
// T x T scratch lives in the context's grow-only workspace), in float32 and,
// on CUDA, bfloat16.
TEST_P(AttentionOnBackend, WarmCallsAllocateNothing) {
  std::mt19937_64 rng(34);
  const Shape s{2, 3, 33, 16};
  for (DType dt : {DType::F32, DType::BF16}) {
    if (dt != DType::F32 && !on_cuda()) continue;
    SCOPED_TRACE(dtype_name(dt));
    auto make = [&] {
      Tensor h = ft::random_tensor(s, rng);
      return up(dt == DType::F32 ? h : to_low(h, dt));
    };
    Tensor q = make(), k = make(), v = make(), g = make(), y = make(), dq = make(), dk = make(), dv = make();
    Tensor lse = poisoned(Shape{2, 3, 33});
    auto step = [&] {
      kernels::attention_forward(ctx(), q, k, v, 0.25f, y, lse);
      kernels::attention_backward(ctx(), q, k, v, 0.25f, y, lse, g, dq, dk, dv);
    };
    step();
    const AllocStats before = alloc_stats();
    const size_t ws = ctx().workspace_size();
    step();
    step();
    const AllocStats after = alloc_stats();
    EXPECT_EQ(after.device_allocs, before.device_allocs);
    EXPECT_EQ(after.host_allocs, before.host_allocs);
    EXPECT_EQ(ctx().workspace_size(), ws);
    down(dq);  // finish the queued work before the tensors go
  }
}

// Mixed dtypes throw on every backend.
TEST_P(AttentionOnBackend, MixedDtypesThrow) {
  const Shape s{1, 2, 4, 3};
  Tensor q = up(Tensor::zeros(s)), k = up(Tensor::zeros(s)), v = up(Tensor::zeros(s)), y = up(Tensor::zeros(s));
  Tensor lse = up(Tensor::zeros(Shape{1, 2, 4}));
  Tensor kb = up(Tensor::zeros(s, DType::BF16)), yb = up(Tensor::zeros(s, DType::BF16));
  Tensor lse_b = up(Tensor::zeros(Shape{1, 2, 4}, DType::BF16));
  EXPECT_THROW(kernels::attention_forward(ctx(), q, kb, v, 1.0f, y, lse), Error);
  EXPECT_THROW(kernels::attention_forward(ctx(), q, k, v, 1.0f, yb, lse), Error);
  EXPECT_THROW(kernels::attention_forward(ctx(), q, k, v, 1.0f, y, lse_b), Error);
  Tensor dq = up(Tensor::zeros(s)), dk = up(Tensor::zeros(s)), dvb = up(Tensor::zeros(s, DType::BF16));
  EXPECT_THROW(kernels::attention_backward(ctx(), q, k, v, 1.0f, y, lse, y, dq, dk, dvb), Error);
}

// On the CPU a head's results do not depend on the other heads of the call:
// a batch of 4 (32 heads) and each of its rows alone (8 heads) give the same
// bits, so a DataParallel replica computes its share as one device would.
// attention_decode: Tq queries at positions [n - Tq, n) over the first n
// rows of a (B, H, Tk, D) key-value cache, against float64 on the rounded
// operands, in float32, bfloat16 and float16 storage. The cache's rows past
// n hold NaN, so reading one would show. At n = Tq = Tk it is the full causal
// attention: attention_forward's y within the same bound.
TEST_P(AttentionOnBackend, DecodeOverACacheAgainstFloat64) {
  ctx().math.allow_tf32 = false;
  std::mt19937_64 rng(37);
  struct Case {
    int64_t b, h, tk, d, n, tq;
  };
  // Short rows; keys and features past a CUDA block's threads (loops of several passes).
  const Case cases[] = {{2, 3, 40, 24, 1, 1},  {2, 3, 40, 24, 17, 1}, {2, 3, 40, 24, 17, 5}, {2, 3, 40, 24, 33, 33},
                        {2, 3, 40, 24, 40, 1}, {2, 3, 40, 24, 40, 40}, {1, 2, 300, 16, 290, 3}, {1, 1, 8, 300, 7, 2}};
  for (DType dt : {DType::F32, DType::BF16, DType::F16})
    for (const Case cs : cases) {
      const int64_t B = cs.b, H = cs.h, Tk = cs.tk, D = cs.d;
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " Tk=" << Tk << " D=" << D << " n=" << cs.n
                                        << " Tq=" << cs.tq);
      Tensor q = ft::random_tensor(Shape{B, H, cs.tq, D}, rng), k = ft::random_tensor(Shape{B, H, Tk, D}, rng),
             v = ft::random_tensor(Shape{B, H, Tk, D}, rng);
      for (Tensor* c : {&k, &v})
        for (int64_t bh = 0; bh < B * H; ++bh)
          std::fill(c->f32() + (bh * Tk + cs.n) * D, c->f32() + (bh + 1) * Tk * D,
                    std::numeric_limits<float>::quiet_NaN());
      const bool low = dt != DType::F32;
      auto in = [&](Tensor& x) { return low ? up(to_low(x, dt)) : up(x); };  // x becomes the rounded values
      Tensor qd = in(q), kd = in(k), vd = in(v);
      Tensor yd = low ? up(nan_low(q.shape(), dt)) : poisoned(q.shape());
      kernels::attention_decode(ctx(), qd, kd, vd, cs.n, scale, yd);
      const Tensor y = low ? from_low(down(yd)) : down(yd);
      std::vector<double> want(static_cast<size_t>(q.numel()));
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < cs.tq; ++i) {
          const float* qi = q.f32() + (bh * cs.tq + i) * D;
          const int64_t seen = cs.n - cs.tq + i + 1;
          std::vector<double> sc(static_cast<size_t>(seen));
          double m = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int64_t j = 0; j < seen; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < D; ++c) dot += double(qi[c]) * k.f32()[(bh * Tk + j) * D + c];
            sc[j] = double(scale) * dot;
            m = std::max(m, sc[j]);
          }
          for (double& x : sc) sum += (x = std::exp(x - m));
          for (int64_t c = 0; c < D; ++c) {
            double acc = 0;
            for (int64_t j = 0; j < seen; ++j) acc += sc[j] * v.f32()[(bh * Tk + j) * D + c];
            want[static_cast<size_t>((bh * cs.tq + i) * D + c)] = acc / sum;
          }
        }
      // float32: the sums' rounding; a low type: y's own rounding (half an ulp of 2^-8 or 2^-11) on top.
      const double t = dt == DType::BF16 ? 1.0 / 256 : dt == DType::F16 ? 1.0 / 2048 : 1e-5;
      EXPECT_TRUE(matches(y, want, t, std::max(t, 2e-5)));
      if (cs.n == Tk && cs.tq == Tk && dt == DType::F32) {  // the full causal attention, as attention_forward
        Tensor yf = poisoned(q.shape()), lse = poisoned(Shape{B, H, Tk});
        kernels::attention_forward(ctx(), qd, kd, vd, scale, yf, lse);
        EXPECT_TRUE(matches(down(yf), want, 1e-5, 2e-5));
      }
    }
}

TEST_P(AttentionOnBackend, DecodeRefusesWhatDoesNotFit) {
  const Shape qs{1, 2, 3, 8}, cs{1, 2, 10, 8};
  Tensor q = up(Tensor::zeros(qs)), k = up(Tensor::zeros(cs)), v = up(Tensor::zeros(cs)), y = up(Tensor::zeros(qs));
  EXPECT_THROW(kernels::attention_decode(ctx(), q, k, v, 2, 1.0f, y), Error);   // 3 queries, 2 positions
  EXPECT_THROW(kernels::attention_decode(ctx(), q, k, v, 11, 1.0f, y), Error);  // past the cache
  Tensor other_d = up(Tensor::zeros(Shape{1, 2, 10, 4}));
  EXPECT_THROW(kernels::attention_decode(ctx(), q, other_d, other_d, 5, 1.0f, y), Error);
  Tensor low = up(Tensor::zeros(cs, DType::BF16));
  EXPECT_THROW(kernels::attention_decode(ctx(), q, low, low, 5, 1.0f, y), Error);  // dtypes differ
  Tensor y_wrong = up(Tensor::zeros(Shape{1, 2, 4, 8}));
  EXPECT_THROW(kernels::attention_decode(ctx(), q, k, v, 5, 1.0f, y_wrong), Error);
}

TEST(Attention, CpuHeadsDoNotDependOnTheOtherHeadsOfTheCall) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(36);
  const Shape s{4, 8, 77, 24};
  const Tensor q = ft::random_tensor(s, rng), k = ft::random_tensor(s, rng), v = ft::random_tensor(s, rng);
  const Tensor g = ft::random_tensor(s, rng);
  auto run = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g) {
    const Shape sh = q.shape();
    Tensor y = Tensor::empty(sh), lse = Tensor::empty(Shape{sh[0], sh[1], sh[2]});
    Tensor dq = Tensor::empty(sh), dk = Tensor::empty(sh), dv = Tensor::empty(sh);
    kernels::attention_forward(ctx, q, k, v, 0.2f, y, lse);
    kernels::attention_backward(ctx, q, k, v, 0.2f, y, lse, g, dq, dk, dv);
    return std::vector<Tensor>{y, lse, dq, dk, dv};
  };
  const std::vector<Tensor> all = run(q, k, v, g);
  for (int64_t b = 0; b < 4; ++b) {
    const std::vector<Tensor> one = run(q.slice(b, b + 1), k.slice(b, b + 1), v.slice(b, b + 1), g.slice(b, b + 1));
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(ft::same_bits(one[i], all[i].slice(b, b + 1))) << "batch row " << b << ", output " << i;
  }
}

TEST(Attention, BadArgumentsThrow) {
  Context ctx(Device::cpu());
  const Shape s{1, 2, 4, 3};
  Tensor q = Tensor::zeros(s), k = Tensor::zeros(s), v = Tensor::zeros(s), y = Tensor::zeros(s);
  Tensor lse = Tensor::zeros(Shape{1, 2, 4});
  Tensor k_bad = Tensor::zeros(Shape{1, 2, 5, 3}), lse_bad = Tensor::zeros(Shape{1, 2, 3});
  Tensor q3 = Tensor::zeros(Shape{2, 4, 3}), lse3 = Tensor::zeros(Shape{2, 4});
  EXPECT_THROW(kernels::attention_forward(ctx, q, k_bad, v, 1.0f, y, lse), Error);
  EXPECT_THROW(kernels::attention_forward(ctx, q, k, v, 1.0f, y, lse_bad), Error);
  EXPECT_THROW(kernels::attention_forward(ctx, q3, q3, q3, 1.0f, q3, lse3), Error);
  EXPECT_THROW(kernels::attention_forward(ctx, q, k, v, std::numeric_limits<float>::infinity(), y, lse), Error);
  Tensor dq = Tensor::zeros(s), dk = Tensor::zeros(s), dv_bad = Tensor::zeros(Shape{1, 2, 4, 4});
  EXPECT_THROW(kernels::attention_backward(ctx, q, k, v, 1.0f, y, lse, y, dq, dk, dv_bad), Error);
}

}  // namespace
}  // namespace fanout
