// Batch normalization split into stats / finalize / apply (and the backward
// pair) against a double-precision reference: statistics, running-stat update
// (momentum, unbiased variance), eval mode, central-difference gradients in
// training mode through the whole chain, and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/batchnorm.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// Views x as (N, C, S).
struct Ncs {
  int64_t n, c, s;
  explicit Ncs(const Tensor& x) : n(x.size(0)), c(x.size(1)), s(x.numel() / (x.size(0) * x.size(1))) {}
  int64_t at(int64_t i, int64_t ch, int64_t k) const { return (i * c + ch) * s + k; }
};

// Per-channel batch mean and biased variance in double (two-pass).
void naive_moments(const Tensor& x, std::vector<double>& mean, std::vector<double>& var) {
  Ncs d(x);
  mean.assign(d.c, 0.0);
  var.assign(d.c, 0.0);
  const double m = static_cast<double>(d.n * d.s);
  for (int64_t c = 0; c < d.c; ++c) {
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t k = 0; k < d.s; ++k) mean[c] += x.f32()[d.at(i, c, k)];
    mean[c] /= m;
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t k = 0; k < d.s; ++k) {
        const double t = x.f32()[d.at(i, c, k)] - mean[c];
        var[c] += t * t;
      }
    var[c] /= m;
  }
}

struct BnFixture {
  Context ctx{Device::cpu()};
  Tensor x, gamma, beta, stats, mean, invstd, y;
  int64_t c = 0, count = 0;
  float eps = 1e-5f;
  BnFixture(const Shape& s, std::mt19937_64& rng) {
    x = ft::random_tensor(s, rng, -1.0f, 2.0f);
    c = s[1];
    count = x.numel() / c;
    gamma = ft::random_tensor(Shape{c}, rng, 0.5f, 1.5f);
    beta = ft::random_tensor(Shape{c}, rng);
    stats = Tensor::empty(Shape{3, c}, DType::F64);
    mean = Tensor::empty(Shape{2, c});
    invstd = Tensor::empty(Shape{c});
    y = Tensor::empty(s);
  }
  // Training-mode forward through the three kernels.
  void forward() {
    kernels::bn_stats(ctx, x, stats);
    kernels::bn_finalize(ctx, stats, count, eps, 0.1f, mean, invstd, nullptr, nullptr);
    kernels::bn_apply(ctx, x, mean, invstd, gamma, beta, y);
  }
};

const Shape kShapes[] = {Shape{3, 5, 7, 9}, Shape{6, 5}, Shape{2, 4, 3, 1, 5}};

TEST(BatchNorm, StatsFinalizeApplyAgainstNaive) {
  std::mt19937_64 rng(61);
  for (const Shape& s : kShapes) {
    BnFixture f(s, rng);
    ft::poison(f.stats);
    ft::poison(f.mean);
    ft::poison(f.invstd);
    ft::poison(f.y);
    f.forward();
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    Ncs d(f.x);
    for (int64_t c = 0; c < d.c; ++c) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const double t = f.x.f32()[d.at(i, c, k)];
          sum += t;
          sq += t * t;
        }
      (void)sq;
      const double n = static_cast<double>(f.count);
      EXPECT_NEAR(f.stats.f64()[c], sum, 1e-12 * std::max(1.0, std::abs(sum))) << s.str();
      EXPECT_NEAR(f.stats.f64()[d.c + c], v[c] * n, 1e-12 * v[c] * n) << s.str();  // deviations from the mean
      EXPECT_NEAR(f.stats.f64()[2 * d.c + c], sum * sum / n, 1e-12 * std::max(1.0, sum * sum / n)) << s.str();
      // The mean as hi + lo: float64 accurate, hi the nearest float.
      EXPECT_NEAR(static_cast<double>(f.mean.f32()[c]) + f.mean.f32()[d.c + c], m[c], 1e-13) << s.str();
      EXPECT_EQ(f.mean.f32()[c], static_cast<float>(m[c])) << s.str();
      EXPECT_NEAR(f.invstd.f32()[c], 1.0 / std::sqrt(v[c] + f.eps), 1e-4) << s.str();
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          const double ref = (f.x.f32()[j] - m[c]) / std::sqrt(v[c] + f.eps) * f.gamma.f32()[c] + f.beta.f32()[c];
          ASSERT_NEAR(f.y.f32()[j], ref, 1e-4) << s.str();
        }
    }
    EXPECT_GT(ft::l2_norm(f.y), 0.0);
  }
}

TEST(BatchNorm, RunningStatsUseMomentumAndUnbiasedVariance) {
  std::mt19937_64 rng(62);
  for (const Shape& s : kShapes) {
    BnFixture f(s, rng);
    Tensor rm = ft::random_tensor(Shape{f.c}, rng), rv = ft::random_tensor(Shape{f.c}, rng, 0.5f, 2.0f);
    Tensor rm0 = ft::clone(rm), rv0 = ft::clone(rv);
    const float momentum = 0.1f;
    kernels::bn_stats(f.ctx, f.x, f.stats);
    kernels::bn_finalize(f.ctx, f.stats, f.count, f.eps, momentum, f.mean, f.invstd, &rm, &rv);
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    const double n = static_cast<double>(f.count);
    for (int64_t c = 0; c < f.c; ++c) {
      // PyTorch: running = (1 - momentum) * running + momentum * batch, variance unbiased.
      EXPECT_NEAR(rm.f32()[c], 0.9 * rm0.f32()[c] + 0.1 * m[c], 1e-5) << s.str();
      EXPECT_NEAR(rv.f32()[c], 0.9 * rv0.f32()[c] + 0.1 * v[c] * n / (n - 1), 1e-5) << s.str();
    }
    // Without running stats the same call only writes mean / invstd.
    EXPECT_NO_THROW(kernels::bn_finalize(f.ctx, f.stats, f.count, f.eps, momentum, f.mean, f.invstd, nullptr,
                                         nullptr));
  }
}

TEST(BatchNorm, ForwardEval) {
  std::mt19937_64 rng(63);
  for (const Shape& s : kShapes) {
    BnFixture f(s, rng);
    Tensor rm = ft::random_tensor(Shape{f.c}, rng), rv = ft::random_tensor(Shape{f.c}, rng, 0.1f, 2.0f);
    ft::poison(f.y);
    kernels::bn_forward_eval(f.ctx, f.x, rm, rv, f.gamma, f.beta, f.eps, f.y);
    Ncs d(f.x);
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          const double ref = (f.x.f32()[j] - double(rm.f32()[c])) / std::sqrt(double(rv.f32()[c]) + f.eps) *
                                 f.gamma.f32()[c] + f.beta.f32()[c];
          ASSERT_NEAR(f.y.f32()[j], ref, 1e-5) << s.str();
        }
    EXPECT_GT(ft::l2_norm(f.y), 0.0);
  }
}

TEST(BatchNorm, TrainingGradients) {
  std::mt19937_64 rng(64);
  for (const Shape& s : kShapes) {
    BnFixture f(s, rng);
    Tensor r = ft::random_tensor(s, rng);  // dL/dy for L = <r, y>
    f.forward();
    Tensor gs = Tensor::empty(Shape{2, f.c}), dx = Tensor::empty(s);
    ft::poison(gs);
    ft::poison(dx);
    kernels::bn_backward_reduce(f.ctx, f.x, r, f.mean, f.invstd, gs);
    kernels::bn_backward_apply(f.ctx, f.x, r, f.mean, f.invstd, f.gamma, gs, f.count, dx);
    Tensor dbeta = Tensor::empty(Shape{f.c}), dgamma = Tensor::empty(Shape{f.c});
    for (int64_t c = 0; c < f.c; ++c) {
      dbeta.f32()[c] = gs.f32()[c];
      dgamma.f32()[c] = gs.f32()[f.c + c];
    }

    // Double reference: dx = invstd / M * (M * g - sum g - xhat * sum g xhat), g = dy * gamma.
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    Ncs d(f.x);
    const double cnt = static_cast<double>(f.count);
    for (int64_t c = 0; c < d.c; ++c) {
      const double is = 1.0 / std::sqrt(v[c] + f.eps);
      double sdy = 0, sdyx = 0;
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          sdy += r.f32()[j];
          sdyx += r.f32()[j] * (f.x.f32()[j] - m[c]) * is;
        }
      EXPECT_NEAR(dbeta.f32()[c], sdy, 1e-4) << s.str();
      EXPECT_NEAR(dgamma.f32()[c], sdyx, 1e-4) << s.str();
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          const double xhat = (f.x.f32()[j] - m[c]) * is;
          const double g = f.gamma.f32()[c];
          const double ref = g * is / cnt * (cnt * r.f32()[j] - sdy - xhat * sdyx);
          ASSERT_NEAR(dx.f32()[j], ref, 1e-4) << s.str();
        }
    }

    auto loss = [&] {
      f.forward();
      return ft::dot(f.y, r);
    };
    for (auto [t, g, name] :
         {std::tuple{&f.x, &dx, "x"}, std::tuple{&f.gamma, &dgamma, "gamma"}, std::tuple{&f.beta, &dbeta, "beta"}}) {
      auto res = ft::grad_check_detail(loss, *t, *g, 1e-2);
      EXPECT_LT(res.worst, 2e-2) << s.str() << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << s.str() << " d" << name;
      EXPECT_GT(ft::l2_norm(*g), 0.0) << s.str() << " d" << name;
    }
  }
}

TEST(BatchNorm, BackwardApplyMayAliasDy) {
  std::mt19937_64 rng(65);
  BnFixture f(Shape{3, 5, 7, 9}, rng);
  Tensor r = ft::random_tensor(f.x.shape(), rng);
  f.forward();
  Tensor gs = Tensor::empty(Shape{2, f.c}), dx = Tensor::empty(f.x.shape());
  kernels::bn_backward_reduce(f.ctx, f.x, r, f.mean, f.invstd, gs);
  kernels::bn_backward_apply(f.ctx, f.x, r, f.mean, f.invstd, f.gamma, gs, f.count, dx);
  kernels::bn_backward_apply(f.ctx, f.x, r, f.mean, f.invstd, f.gamma, gs, f.count, r);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_EQ(r.f32()[i], dx.f32()[i]);
}

TEST(BatchNorm, ErrorsThrow) {
  std::mt19937_64 rng(66);
  BnFixture f(Shape{3, 5, 7, 9}, rng);
  Tensor bad_stats = Tensor::empty(Shape{3, 4}, DType::F64), short_gamma = Tensor::empty(Shape{4});
  EXPECT_THROW(kernels::bn_stats(f.ctx, f.x, bad_stats), Error);
  Tensor f32_stats = Tensor::empty(Shape{3, 5});  // the statistics are float64
  EXPECT_THROW(kernels::bn_stats(f.ctx, f.x, f32_stats), Error);
  Tensor one_row_mean = Tensor::empty(Shape{5});  // the mean is (hi, lo)
  EXPECT_THROW(kernels::bn_finalize(f.ctx, f.stats, f.count, f.eps, 0.1f, one_row_mean, f.invstd, nullptr, nullptr),
               Error);
  f.forward();
  EXPECT_THROW(kernels::bn_apply(f.ctx, f.x, f.mean, f.invstd, short_gamma, f.beta, f.y), Error);
  Tensor y_bad = Tensor::empty(Shape{3, 5, 9, 7});
  EXPECT_THROW(kernels::bn_apply(f.ctx, f.x, f.mean, f.invstd, f.gamma, f.beta, y_bad), Error);
  Tensor gs = Tensor::empty(Shape{2, 5});
  EXPECT_THROW(kernels::bn_backward_reduce(f.ctx, f.x, y_bad, f.mean, f.invstd, gs), Error);
  Tensor x1 = Tensor::empty(Shape{5});
  EXPECT_THROW(kernels::bn_stats(f.ctx, x1, f.stats), Error);
  // One value per channel cannot give an unbiased running variance (PyTorch refuses too).
  Tensor rm = Tensor::zeros(Shape{5}), rv = Tensor::zeros(Shape{5});
  EXPECT_THROW(kernels::bn_finalize(f.ctx, f.stats, 1, f.eps, 0.1f, f.mean, f.invstd, &rm, &rv), Error);
  EXPECT_THROW(kernels::bn_finalize(f.ctx, f.stats, 0, f.eps, 0.1f, f.mean, f.invstd, nullptr, nullptr), Error);
  try {
    kernels::bn_apply(f.ctx, f.x, f.mean, f.invstd, short_gamma, f.beta, f.y);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bn_apply"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
