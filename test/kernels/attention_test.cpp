// Causal attention on every backend against a naive float64 reference (full
// T x T softmax with the causal mask): forward y and lse, backward dq, dk, dv,
// and backward against central differences of a scalar loss. The CUDA
// backend does not exist yet: the cuda instances check that it throws.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/backend_test_util.h"
#include "runtime/core/error.h"

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

FANOUT_BACKEND_SUITE(AttentionOnBackend);

TEST_P(AttentionOnBackend, ForwardAndBackwardAgainstFloat64) {
  std::mt19937_64 rng(31);
  const int64_t B = 1, H = 3;
  for (int64_t T : {1, 7, 64, 256})
    for (int64_t D : {16, 64}) {
      SCOPED_TRACE(::testing::Message() << "T=" << T << " D=" << D);
      const Shape s{B, H, T, D};
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      Tensor q = ft::random_tensor(s, rng), k = ft::random_tensor(s, rng), v = ft::random_tensor(s, rng);
      Tensor g = ft::random_tensor(s, rng);
      Tensor qd = up(q), kd = up(k), vd = up(v), gd = up(g);
      Tensor yd = poisoned(s), ld = poisoned(Shape{B, H, T});
      Tensor dqd = poisoned(s), dkd = poisoned(s), dvd = poisoned(s);
      if (on_cuda()) {
        EXPECT_THROW(kernels::attention_forward(ctx(), qd, kd, vd, scale, yd, ld), Error);
        EXPECT_THROW(kernels::attention_backward(ctx(), qd, kd, vd, scale, yd, ld, gd, dqd, dkd, dvd), Error);
        continue;  // no CUDA backend yet
      }
      kernels::attention_forward(ctx(), qd, kd, vd, scale, yd, ld);
      kernels::attention_backward(ctx(), qd, kd, vd, scale, yd, ld, gd, dqd, dkd, dvd);
      const Ref r = naive_attention(q.f32(), k.f32(), v.f32(), g.f32(), B * H, T, D, scale);
      const Tensor y = down(yd), lse = down(ld), dq = down(dqd), dk = down(dkd), dv = down(dvd);
      EXPECT_TRUE(matches(y, r.y, 1e-5, 1e-4)) << "y";
      EXPECT_TRUE(matches(lse, r.lse, 1e-5, 1e-4)) << "lse";
      EXPECT_TRUE(matches(dq, r.dq, 1e-5, 1e-4)) << "dq";
      EXPECT_TRUE(matches(dk, r.dk, 1e-5, 1e-4)) << "dk";
      EXPECT_TRUE(matches(dv, r.dv, 1e-5, 1e-4)) << "dv";
      for (const Tensor* t : {&y, &dk, &dv}) EXPECT_GT(ft::l2_norm(*t), 0.0);
      if (T > 1) EXPECT_GT(ft::l2_norm(dq), 0.0);  // T == 1: one key, softmax constant, dq = 0
    }
}

// loss = sum(g * y): its central differences in q, k and v (double steps on
// float inputs) against backward's dq, dk, dv at a small size.
TEST_P(AttentionOnBackend, BackwardAgainstCentralDifferences) {
  if (on_cuda()) GTEST_SKIP() << "no CUDA attention backend yet (see ForwardAndBackwardAgainstFloat64)";
  std::mt19937_64 rng(32);
  const Shape s{1, 2, 5, 3};
  const float scale = 0.7f;
  Tensor q = ft::random_tensor(s, rng), k = ft::random_tensor(s, rng), v = ft::random_tensor(s, rng);
  Tensor g = ft::random_tensor(s, rng);
  Tensor y = poisoned(s), lse = poisoned(Shape{1, 2, 5});
  Tensor dq = poisoned(s), dk = poisoned(s), dv = poisoned(s);
  kernels::attention_forward(ctx(), q, k, v, scale, y, lse);
  kernels::attention_backward(ctx(), q, k, v, scale, y, lse, g, dq, dk, dv);
  auto loss = [&] {
    Tensor yy = poisoned(s), ll = poisoned(Shape{1, 2, 5});
    kernels::attention_forward(ctx(), q, k, v, scale, yy, ll);
    double l = 0;
    for (int64_t i = 0; i < yy.numel(); ++i) l += double(g.f32()[i]) * yy.f32()[i];
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
