// Batch normalization split into stats / finalize / apply (and the backward
// pair) on every backend against a double-precision reference: statistics,
// running-stat update (momentum, unbiased variance), eval mode,
// central-difference gradients in training mode through the whole chain,
// determinism, aliasing and errors; odd sizes, large planes, and means far
// from zero.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/batchnorm.h"
#include "runtime/core/half.h"
#include "runtime/core/error.h"

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

// Host inputs of one case and their backend copies and outputs.
struct BnRun {
  Tensor x, gamma, beta, running_mean, running_var;  // host; running variances in [0.1, 2)
  Tensor xd, gammad, betad, rmd, rvd, stats, mean, invstd, y;  // backend
  int64_t c = 0, count = 0;
  float eps = 1e-5f;
};

class BatchNormOnBackend : public ft::BackendTest {
 protected:
  BnRun make(const Shape& s, std::mt19937_64& rng, float lo = -1.0f, float hi = 2.0f) {
    BnRun r;
    r.x = ft::random_tensor(s, rng, lo, hi);
    r.c = s[1];
    r.count = r.x.numel() / r.c;
    r.gamma = ft::random_tensor(Shape{r.c}, rng, 0.5f, 1.5f);
    r.beta = ft::random_tensor(Shape{r.c}, rng);
    // Their own stream, so the draws of x, gamma and beta do not move.
    std::mt19937_64 running(static_cast<uint64_t>(s.numel()) * 1000003u + static_cast<uint64_t>(r.c));
    r.running_mean = ft::random_tensor(Shape{r.c}, running);
    r.running_var = ft::random_tensor(Shape{r.c}, running, 0.1f, 2.0f);
    r.rmd = up(r.running_mean);
    r.rvd = up(r.running_var);
    upload(r);
    r.stats = poisoned(Shape{3, r.c}, DType::F64);
    r.mean = poisoned(Shape{2, r.c});
    r.invstd = poisoned(Shape{r.c});
    r.y = poisoned(s);
    return r;
  }
  // After the host inputs changed (central differences).
  void upload(BnRun& r) {
    r.xd = up(r.x);
    r.gammad = up(r.gamma);
    r.betad = up(r.beta);
  }
  // Training-mode forward through the three kernels.
  void forward(BnRun& r) {
    kernels::bn_stats(ctx(), r.xd, r.stats);
    kernels::bn_finalize(ctx(), r.stats, r.count, r.eps, 0.1f, r.mean, r.invstd, nullptr, nullptr);
    kernels::bn_apply(ctx(), r.xd, r.mean, r.invstd, r.gammad, r.betad, r.y);
  }
};
FANOUT_ON_EVERY_BACKEND(BatchNormOnBackend);

struct BnShape {
  Shape s;
  float lo, hi;
};
const BnShape kShapes[] = {{Shape{3, 5, 7, 9}, -1.0f, 2.0f}, {Shape{6, 5}, -1.0f, 2.0f},
                           {Shape{2, 4, 3, 1, 5}, -1.0f, 2.0f}};
// Odd sizes, one value per plane, means far from zero, many partial blocks
// per channel (N*H*W = 64*33*31) with few channels, planes of whole blocks (8x8).
const BnShape kMoreShapes[] = {{Shape{2, 3, 1, 1}, -1.0f, 1.0f},   {Shape{5, 7, 3, 3}, 2.0f, 4.0f},
                               {Shape{13, 6}, -1.0f, 1.0f},        {Shape{257, 33}, -1.0f, 1.0f},
                               {Shape{64, 3, 33, 31}, -1.0f, 1.0f},
                               {Shape{4, 3, 8, 8}, -1.0f, 1.0f}};

// The double reference of a training pass for L = <r, y>: y, per channel
// sum r and sum r xhat (dbeta, dgamma), and
// dx = invstd / M * (M * g - sum g - xhat * sum g xhat), g = r * gamma.
struct BnReference {
  std::vector<double> y, dx, sdy, sdyx;
  BnReference(const BnRun& f, const Tensor& r) : y(f.x.numel()), dx(f.x.numel()) {
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    const Ncs d(f.x);
    const double cnt = static_cast<double>(f.count);
    sdy.assign(d.c, 0.0);
    sdyx.assign(d.c, 0.0);
    for (int64_t c = 0; c < d.c; ++c) {
      const double is = 1.0 / std::sqrt(v[c] + f.eps), g = f.gamma.f32()[c];
      auto xhat = [&](int64_t j) { return (f.x.f32()[j] - m[c]) * is; };
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          sdy[c] += r.f32()[j];
          sdyx[c] += r.f32()[j] * xhat(j);
        }
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          y[j] = xhat(j) * g + f.beta.f32()[c];
          dx[j] = g * is / cnt * (cnt * r.f32()[j] - sdy[c] - xhat(j) * sdyx[c]);
        }
    }
  }
};

TEST_P(BatchNormOnBackend, StatsFinalizeApplyAgainstNaive) {
  std::mt19937_64 rng(61);
  std::vector<BnShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kMoreShapes), std::end(kMoreShapes));
  for (const BnShape& bs : shapes) {
    SCOPED_TRACE(::testing::Message() << bs.s.str() << " in [" << bs.lo << ", " << bs.hi << ")");
    BnRun f = make(bs.s, rng, bs.lo, bs.hi);
    forward(f);
    const Tensor stats = down(f.stats), mean = down(f.mean), invstd = down(f.invstd), y = down(f.y);
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    Ncs d(f.x);
    for (int64_t c = 0; c < d.c; ++c) {
      double sum = 0;
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) sum += f.x.f32()[d.at(i, c, k)];
      const double n = static_cast<double>(f.count);
      EXPECT_NEAR(stats.f64()[c], sum, 1e-12 * std::max(1.0, std::abs(sum)));
      EXPECT_NEAR(stats.f64()[d.c + c], v[c] * n, 1e-12 * v[c] * n);  // deviations from the mean
      EXPECT_NEAR(stats.f64()[2 * d.c + c], sum * sum / n, 1e-12 * std::max(1.0, sum * sum / n));
      // The mean as hi + lo: float64 accurate, hi the nearest float.
      EXPECT_NEAR(static_cast<double>(mean.f32()[c]) + mean.f32()[d.c + c], m[c], 1e-13 * std::max(1.0, std::abs(m[c])));
      EXPECT_EQ(mean.f32()[c], static_cast<float>(m[c]));
      EXPECT_NEAR(invstd.f32()[c], 1.0 / std::sqrt(v[c] + f.eps), 1e-5 / std::sqrt(v[c] + f.eps));
      for (int64_t i = 0; i < d.n; ++i)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          const double ref = (f.x.f32()[j] - m[c]) / std::sqrt(v[c] + f.eps) * f.gamma.f32()[c] + f.beta.f32()[c];
          ASSERT_NEAR(y.f32()[j], ref, 1e-4);
        }
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
  }
}

TEST_P(BatchNormOnBackend, RunningStatsUseMomentumAndUnbiasedVariance) {
  std::mt19937_64 rng(62);
  for (const BnShape& bs : kShapes) {
    SCOPED_TRACE(bs.s.str());
    BnRun f = make(bs.s, rng);
    const float momentum = 0.1f;
    kernels::bn_stats(ctx(), f.xd, f.stats);
    kernels::bn_finalize(ctx(), f.stats, f.count, f.eps, momentum, f.mean, f.invstd, &f.rmd, &f.rvd);
    const Tensor rm = down(f.rmd), rv = down(f.rvd), invstd = down(f.invstd);
    std::vector<double> m, v;
    naive_moments(f.x, m, v);
    const double n = static_cast<double>(f.count);
    for (int64_t c = 0; c < f.c; ++c) {
      // PyTorch: running = (1 - momentum) * running + momentum * batch, variance unbiased.
      EXPECT_NEAR(rm.f32()[c], 0.9 * f.running_mean.f32()[c] + 0.1 * m[c], 1e-5);
      EXPECT_NEAR(rv.f32()[c], 0.9 * f.running_var.f32()[c] + 0.1 * v[c] * n / (n - 1), 1e-5);
    }
    // Without running stats the same call only writes mean / invstd.
    Tensor invstd2 = poisoned(Shape{f.c});
    EXPECT_NO_THROW(
        kernels::bn_finalize(ctx(), f.stats, f.count, f.eps, momentum, f.mean, invstd2, nullptr, nullptr));
    EXPECT_TRUE(ft::same_bits(down(invstd2), invstd));
  }
}

TEST_P(BatchNormOnBackend, ForwardEval) {
  std::mt19937_64 rng(63);
  for (const BnShape& bs : kShapes) {
    SCOPED_TRACE(bs.s.str());
    BnRun f = make(bs.s, rng);
    kernels::bn_forward_eval(ctx(), f.xd, f.rmd, f.rvd, f.gammad, f.betad, f.eps, f.y);
    const Tensor y = down(f.y);
    Ncs d(f.x);
    for (int64_t i = 0; i < d.n; ++i)
      for (int64_t c = 0; c < d.c; ++c)
        for (int64_t k = 0; k < d.s; ++k) {
          const int64_t j = d.at(i, c, k);
          const double mean = f.running_mean.f32()[c], var = f.running_var.f32()[c];
          const double ref = (f.x.f32()[j] - mean) / std::sqrt(var + f.eps) * f.gamma.f32()[c] + f.beta.f32()[c];
          ASSERT_NEAR(y.f32()[j], ref, tol(1e-5, 1e-4));
        }
    EXPECT_GT(ft::l2_norm(y), 0.0);
  }
}

TEST_P(BatchNormOnBackend, TrainingGradients) {
  std::mt19937_64 rng(64);
  std::vector<BnShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kMoreShapes), std::end(kMoreShapes));
  for (const BnShape& bs : shapes) {
    SCOPED_TRACE(bs.s.str());
    BnRun f = make(bs.s, rng, bs.lo, bs.hi);
    Tensor r = ft::random_tensor(bs.s, rng);  // dL/dy for L = <r, y>
    Tensor rd = up(r);
    forward(f);
    Tensor gsd = poisoned(Shape{2, f.c}), dxd = poisoned(bs.s);
    kernels::bn_backward_reduce(ctx(), f.xd, rd, f.mean, f.invstd, gsd);
    kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gsd, f.count, dxd);
    const Tensor gs = down(gsd);
    Tensor dx = down(dxd);
    Tensor dbeta = Tensor::empty(Shape{f.c}), dgamma = Tensor::empty(Shape{f.c});
    for (int64_t c = 0; c < f.c; ++c) {
      dbeta.f32()[c] = gs.f32()[c];
      dgamma.f32()[c] = gs.f32()[f.c + c];
    }

    const BnReference ref(f, r);
    // Sums over up to 64*33*31 values: float accumulation error grows with the count.
    const double sum_tol = 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(f.count) / 100.0));
    for (int64_t c = 0; c < f.c; ++c) {
      EXPECT_NEAR(dbeta.f32()[c], ref.sdy[c], sum_tol);
      EXPECT_NEAR(dgamma.f32()[c], ref.sdyx[c], sum_tol);
    }
    for (int64_t j = 0; j < dx.numel(); ++j) ASSERT_NEAR(dx.f32()[j], ref.dx[j], 1e-4);
    EXPECT_GT(ft::l2_norm(dx), 0.0);

    if (f.x.numel() > 1000) continue;  // central differences on the small shapes
    auto loss = [&] {
      upload(f);
      forward(f);
      return ft::dot(down(f.y), r);
    };
    for (auto [t, g, name] :
         {std::tuple{&f.x, &dx, "x"}, std::tuple{&f.gamma, &dgamma, "gamma"}, std::tuple{&f.beta, &dbeta, "beta"}}) {
      auto res = ft::grad_check_detail(loss, *t, *g, 1e-2);
      EXPECT_LT(res.worst, 2e-2) << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << " d" << name;
      EXPECT_GT(ft::l2_norm(*g), 0.0) << " d" << name;
    }
  }
}

// x, y, dy and dx in low-type storage, either format (statistics and
// parameters float32): y and dx against the double formulas on the stored
// values, within one rounding to the type. 300 channels: more than a block
// of threads (CUDA's channels-last reduction takes them in tiles).
TEST_P(BatchNormOnBackend, LowStorageInEitherFormat) {
  std::mt19937_64 rng(67);
  for (const Shape& s : {Shape{4, 6, 5, 7}, Shape{2, 300, 3, 3}})
  for (const ft::StorageCase& sc : ft::low_storage_cases()) {
    SCOPED_TRACE(sc.name() + " " + s.str());
    BnRun f = make(s, rng);
    const Tensor xs = ft::stored_copy(f.x, sc.dtype, sc.format);
    const Tensor rs = ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format);
    f.x = ft::float32_values(xs);  // the values the kernels read
    f.xd = up(xs);
    f.y = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    forward(f);
    Tensor gsd = poisoned(Shape{2, f.c}), dxd = up(ft::poisoned_stored(s, sc.dtype, sc.format)), rd = up(rs);
    kernels::bn_backward_reduce(ctx(), f.xd, rd, f.mean, f.invstd, gsd);
    kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gsd, f.count, dxd);
    const Tensor y = down(f.y), dx = down(dxd), r = ft::float32_values(rs);
    ASSERT_EQ(y.format(), sc.format);
    ASSERT_EQ(dx.dtype(), sc.dtype);
    const BnReference ref(f, r);
    const double u = ft::unit_roundoff(sc.dtype);
    for (int64_t j = 0; j < f.x.numel(); ++j) {
      ASSERT_NEAR(ft::stored(y, j), ref.y[j], u * std::abs(ref.y[j]) + 1e-4) << j;
      ASSERT_NEAR(ft::stored(dx, j), ref.dx[j], u * std::abs(ref.dx[j]) + 1e-4) << j;
    }
  }
}

TEST_P(BatchNormOnBackend, BackwardApplyMayAliasDy) {
  std::mt19937_64 rng(65);
  BnRun f = make(Shape{3, 5, 7, 9}, rng);
  Tensor rd = up(ft::random_tensor(f.x.shape(), rng));
  forward(f);
  Tensor gs = poisoned(Shape{2, f.c}), dx = poisoned(f.x.shape());
  kernels::bn_backward_reduce(ctx(), f.xd, rd, f.mean, f.invstd, gs);
  kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gs, f.count, dx);
  kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gs, f.count, rd);
  EXPECT_TRUE(ft::same_bits(down(rd), down(dx)));
}

// Under autocast the three writing kernels round what they write to the low
// type: bit for bit the float32 result rounded on the host (statistics and
// arithmetic stay float32), on every backend, for bfloat16 and float16.
TEST_P(BatchNormOnBackend, AutocastRoundsWhatTheKernelsWrite) {
  std::mt19937_64 rng(66);
  BnRun f = make(Shape{3, 5, 7, 9}, rng);
  Tensor rd = up(ft::random_tensor(f.x.shape(), rng));
  forward(f);
  Tensor gs = poisoned(Shape{2, f.c});
  kernels::bn_backward_reduce(ctx(), f.xd, rd, f.mean, f.invstd, gs);
  auto outputs = [&] {
    Tensor y = poisoned(f.x.shape()), ye = poisoned(f.x.shape()), dx = poisoned(f.x.shape());
    kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, y);
    kernels::bn_forward_eval(ctx(), f.xd, f.rmd, f.rvd, f.gammad, f.betad, f.eps, ye);
    kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gs, f.count, dx);
    return std::vector<Tensor>{down(y), down(ye), down(dx)};
  };
  const std::vector<Tensor> full = outputs();
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    ctx().math.autocast = t;
    const std::vector<Tensor> low = outputs();
    ctx().math.autocast = DType::F32;
    for (size_t k = 0; k < full.size(); ++k) {
      int64_t rounded = 0;
      for (int64_t i = 0; i < full[k].numel(); ++i) {
        const float v = full[k].f32()[i];
        const float want = t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(v))
                                            : half::float_from_f16(half::f16_from_float(v));
        ASSERT_EQ(low[k].f32()[i], want) << "output " << k << " element " << i;
        rounded += want != v;
      }
      EXPECT_GT(rounded, full[k].numel() / 2) << "output " << k << ": the float32 values must need rounding";
    }
  }
}

TEST_P(BatchNormOnBackend, StatsAreDeterministic) {
  std::mt19937_64 rng(7);
  Tensor xd = up(ft::random_tensor(Shape{32, 4, 17, 19}, rng));
  Tensor s1 = poisoned(Shape{3, 4}, DType::F64), s2 = poisoned(Shape{3, 4}, DType::F64);
  kernels::bn_stats(ctx(), xd, s1);
  kernels::bn_stats(ctx(), xd, s2);
  const Tensor a = down(s1);
  EXPECT_TRUE(ft::same_bits(down(s2), a));
  EXPECT_FALSE(std::isnan(a.f64()[0]));
}

TEST_P(BatchNormOnBackend, ErrorsThrow) {
  std::mt19937_64 rng(66);
  BnRun f = make(Shape{3, 5, 7, 9}, rng);
  Tensor bad_stats = up(Tensor::empty(Shape{3, 4}, DType::F64)), short_gamma = up(Tensor::empty(Shape{4}));
  EXPECT_THROW(kernels::bn_stats(ctx(), f.xd, bad_stats), Error);
  Tensor f32_stats = up(Tensor::empty(Shape{3, 5}));  // the statistics are float64
  EXPECT_THROW(kernels::bn_stats(ctx(), f.xd, f32_stats), Error);
  Tensor one_row_mean = up(Tensor::empty(Shape{5}));  // the mean is (hi, lo)
  EXPECT_THROW(
      kernels::bn_finalize(ctx(), f.stats, f.count, f.eps, 0.1f, one_row_mean, f.invstd, nullptr, nullptr), Error);
  forward(f);
  EXPECT_THROW(kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, short_gamma, f.betad, f.y), Error);
  Tensor y_bad = up(Tensor::empty(Shape{3, 5, 9, 7}));
  EXPECT_THROW(kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, y_bad), Error);
  Tensor gs = up(Tensor::empty(Shape{2, 5}));
  EXPECT_THROW(kernels::bn_backward_reduce(ctx(), f.xd, y_bad, f.mean, f.invstd, gs), Error);
  Tensor x1 = up(Tensor::empty(Shape{5}));
  EXPECT_THROW(kernels::bn_stats(ctx(), x1, f.stats), Error);
  // One value per channel cannot give an unbiased running variance (PyTorch refuses too).
  Tensor rm = up(Tensor::zeros(Shape{5})), rv = up(Tensor::zeros(Shape{5}));
  EXPECT_THROW(kernels::bn_finalize(ctx(), f.stats, 1, f.eps, 0.1f, f.mean, f.invstd, &rm, &rv), Error);
  EXPECT_THROW(kernels::bn_finalize(ctx(), f.stats, 0, f.eps, 0.1f, f.mean, f.invstd, nullptr, nullptr), Error);
  try {
    kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, short_gamma, f.betad, f.y);
    FAIL() << "bn_apply accepted a short gamma";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bn_apply"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
