// Batch normalization split into stats / finalize / apply (and the backward
// pair) on every backend against a double-precision reference: statistics,
// running-stat update (momentum, unbiased variance), eval mode,
// central-difference gradients in training mode through the whole chain,
// determinism, aliasing and errors; odd sizes, large planes, and means far
// from zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/activation.h"
#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"
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
    Tensor yed = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    kernels::bn_forward_eval(ctx(), f.xd, f.rmd, f.rvd, f.gammad, f.betad, f.eps, yed);
    const Tensor y = down(f.y), dx = down(dxd), ye = down(yed), r = ft::float32_values(rs);
    ASSERT_EQ(y.format(), sc.format);
    ASSERT_EQ(ye.format(), sc.format);
    ASSERT_EQ(dx.dtype(), sc.dtype);
    const BnReference ref(f, r);
    const double u = ft::unit_roundoff(sc.dtype);
    Ncs d(f.x);
    for (int64_t j = 0; j < f.x.numel(); ++j) {
      ASSERT_NEAR(ft::stored(y, j), ref.y[j], u * std::abs(ref.y[j]) + 1e-4) << j;
      ASSERT_NEAR(ft::stored(dx, j), ref.dx[j], u * std::abs(ref.dx[j]) + 1e-4) << j;
      const int64_t c = (j / d.s) % d.c;  // j indexes the logical (N, C, spatial) order
      const double rm = f.running_mean.f32()[c], rv = f.running_var.f32()[c];
      const double eval = (f.x.f32()[j] - rm) / std::sqrt(rv + f.eps) * f.gamma.f32()[c] + f.beta.f32()[c];
      ASSERT_NEAR(ft::stored(ye, j), eval, u * std::abs(eval) + 1e-4) << j;
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

// Under autocast the three writing kernels write in their output's own type,
// as torch runs batch_norm in its input's type: a float32 y, y_eval or dx
// bit for bit the float32 result (not rounded), a low-stored one that result
// rounded to nearest even on the host (statistics and arithmetic stay
// float32), on every backend, for bfloat16 and float16.
TEST_P(BatchNormOnBackend, AutocastWritesInTheOutputsType) {
  std::mt19937_64 rng(66);
  BnRun f = make(Shape{3, 5, 7, 9}, rng);
  Tensor rd = up(ft::random_tensor(f.x.shape(), rng));
  forward(f);
  Tensor gs = poisoned(Shape{2, f.c});
  kernels::bn_backward_reduce(ctx(), f.xd, rd, f.mean, f.invstd, gs);
  auto outputs = [&](DType out) {
    auto fresh = [&] { return up(ft::poisoned_stored(f.x.shape(), out, MemoryFormat::Contiguous)); };
    Tensor y = fresh(), ye = fresh(), dx = fresh();
    kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, y);
    kernels::bn_forward_eval(ctx(), f.xd, f.rmd, f.rvd, f.gammad, f.betad, f.eps, ye);
    kernels::bn_backward_apply(ctx(), f.xd, rd, f.mean, f.invstd, f.gammad, gs, f.count, dx);
    return std::vector<Tensor>{ft::float32_values(down(y)), ft::float32_values(down(ye)), ft::float32_values(down(dx))};
  };
  const std::vector<Tensor> full = outputs(DType::F32);
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    ctx().math.autocast = t;
    const std::vector<Tensor> same = outputs(DType::F32), low = outputs(t);
    ctx().math.autocast = DType::F32;
    for (size_t k = 0; k < full.size(); ++k) {
      EXPECT_TRUE(ft::same_bits(same[k], full[k])) << "output " << k << ": a float32 output is not rounded";
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

// The fused training pass y = max(bn(x) + z, 0) and its backward against
// the double reference: y from the double normalization plus z; g = r where
// the kernel's y > 0 (else 0), and the gradient sums and dx of bn for that g.
// With and without z, on odd shapes and means far from zero.
TEST_P(BatchNormOnBackend, FusedAddReluAgainstDouble) {
  std::mt19937_64 rng(68);
  std::vector<BnShape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kMoreShapes), std::end(kMoreShapes));
  for (const BnShape& bs : shapes)
    for (bool with_z : {true, false}) {
      SCOPED_TRACE(bs.s.str() + (with_z ? " with z" : " without z"));
      BnRun f = make(bs.s, rng, bs.lo, bs.hi);
      const Tensor z = ft::random_tensor(bs.s, rng), r = ft::random_tensor(bs.s, rng);
      const Tensor zd = up(z);
      kernels::bn_stats(ctx(), f.xd, f.stats);
      kernels::bn_finalize(ctx(), f.stats, f.count, f.eps, 0.1f, f.mean, f.invstd, nullptr, nullptr);
      kernels::bn_apply_add_relu(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, with_z ? &zd : nullptr, f.y);
      Tensor gsd = poisoned(Shape{2, f.c}), gd = poisoned(bs.s), dxd = poisoned(bs.s);
      kernels::bn_backward_reduce_relu(ctx(), f.xd, f.y, up(r), f.mean, f.invstd, gsd, gd);
      kernels::bn_backward_apply(ctx(), f.xd, gd, f.mean, f.invstd, f.gammad, gsd, f.count, dxd);
      const Tensor y = down(f.y), g = down(gd), gs = down(gsd), dx = down(dxd);

      Tensor masked = Tensor::empty(bs.s);
      int64_t zeros = 0;
      for (int64_t j = 0; j < y.numel(); ++j) {
        masked.f32()[j] = y.f32()[j] > 0.0f ? r.f32()[j] : 0.0f;
        zeros += y.f32()[j] == 0.0f;
      }
      const BnReference ref(f, masked);
      for (int64_t j = 0; j < y.numel(); ++j) {
        const double want = std::max(0.0, ref.y[j] + (with_z ? z.f32()[j] : 0.0));
        ASSERT_NEAR(y.f32()[j], want, 1e-5 * (1.0 + std::abs(want))) << j;
        ASSERT_EQ(g.f32()[j], masked.f32()[j]) << j;
        ASSERT_NEAR(dx.f32()[j], ref.dx[j], 1e-4) << j;
      }
      const double sum_tol = 1e-4 * std::max(1.0, std::sqrt(static_cast<double>(f.count) / 100.0));
      for (int64_t c = 0; c < f.c; ++c) {
        EXPECT_NEAR(gs.f32()[c], ref.sdy[c], sum_tol);
        EXPECT_NEAR(gs.f32()[f.c + c], ref.sdyx[c], sum_tol);
      }
      if (y.numel() >= 16) {  // the ReLU cuts some values and keeps others
        EXPECT_GT(zeros, 0);
        EXPECT_LT(zeros, y.numel());
      }
    }
}

// The fused pair has the bits of the unfused kernels in turn (bn_apply, add
// rounded as autocast asks, relu_forward; relu_backward, bn_backward_reduce)
// in every storage and format and under autocast to bfloat16 and float16,
// also with y over z and g over dy (in place).
TEST_P(BatchNormOnBackend, FusedAddReluHasTheUnfusedBits) {
  std::mt19937_64 rng(69);
  std::vector<ft::StorageCase> cases = ft::low_storage_cases();
  cases.push_back({DType::F32, MemoryFormat::Contiguous});
  for (const Shape& s : {Shape{4, 6, 5, 7}, Shape{2, 300, 3, 3}, Shape{9, 5}})
    for (const ft::StorageCase& sc : cases)
      for (DType autocast : {DType::F32, DType::BF16, DType::F16}) {
        if (sc.dtype != DType::F32 && autocast != DType::F32 && autocast != sc.dtype) continue;
        SCOPED_TRACE(sc.name() + " " + s.str() + " autocast " + dtype_name(autocast));
        const MemoryFormat fmt = s.ndim == 4 ? sc.format : MemoryFormat::Contiguous;
        BnRun f = make(s, rng);
        f.xd = up(ft::stored_copy(f.x, sc.dtype, fmt));
        const Tensor zd = up(ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, fmt));
        const Tensor rd = up(ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, fmt));
        ctx().math.autocast = autocast;
        kernels::bn_stats(ctx(), f.xd, f.stats);
        kernels::bn_finalize(ctx(), f.stats, f.count, f.eps, 0.1f, f.mean, f.invstd, nullptr, nullptr);
        auto fresh = [&] { return up(ft::poisoned_stored(s, sc.dtype, fmt)); };
        for (bool with_z : {true, false}) {
          SCOPED_TRACE(with_z ? "with z" : "without z");
          Tensor want = fresh();
          // The layers round to their output's type (a float32 one: not at all), as BatchNormNd passes it.
          kernels::bn_apply(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, want);
          if (with_z) kernels::add(ctx(), want, zd, want, sc.dtype);
          kernels::relu_forward(ctx(), want, want);
          Tensor y = fresh();
          kernels::bn_apply_add_relu(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, with_z ? &zd : nullptr, y,
                                     sc.dtype);
          const Tensor want_host = down(want);
          ASSERT_TRUE(ft::same_bits(down(y), want_host));
          if (with_z) {  // in place over z
            Tensor zy = up(down(zd));
            kernels::bn_apply_add_relu(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, &zy, zy, sc.dtype);
            ASSERT_TRUE(ft::same_bits(down(zy), want_host));
          }

          Tensor gw = fresh(), gsw = poisoned(Shape{2, f.c});
          kernels::relu_backward(ctx(), want, rd, gw);
          kernels::bn_backward_reduce(ctx(), f.xd, gw, f.mean, f.invstd, gsw);
          Tensor g = fresh(), gs = poisoned(Shape{2, f.c});
          kernels::bn_backward_reduce_relu(ctx(), f.xd, want, rd, f.mean, f.invstd, gs, g);
          ASSERT_TRUE(ft::same_bits(down(g), down(gw)));
          ASSERT_TRUE(ft::same_bits(down(gs), down(gsw)));
          Tensor dyg = up(down(rd));  // g over dy
          kernels::bn_backward_reduce_relu(ctx(), f.xd, want, dyg, f.mean, f.invstd, gs, dyg);
          ASSERT_TRUE(ft::same_bits(down(dyg), down(gw)));
          ASSERT_TRUE(ft::same_bits(down(gs), down(gsw)));
        }
        ctx().math.autocast = DType::F32;
      }
}

// The whole training pass in one call each way (bn_train_add_relu,
// bn_backward_relu) against float64, in float32 and in low-type storage of
// either format (on a GPU the low channels-last cases are cuDNN's fused
// graphs): y within the type's roundings of max(bn(x) + z, 0) over the
// stored values, the batch mean, invstd and the running statistics
// (momentum, unbiased variance) as PyTorch updates them, g exactly dy where
// y > 0, the gradient sums and dx for that g. 16 and 24 channels: cuDNN's
// engines want multiples of 8.
TEST_P(BatchNormOnBackend, WholeTrainingPassAgainstDouble) {
  std::mt19937_64 rng(71);
  std::vector<ft::StorageCase> cases = ft::low_storage_cases();
  cases.push_back({DType::F32, MemoryFormat::Contiguous});
  for (const Shape& s : {Shape{4, 16, 5, 6}, Shape{2, 24, 8, 8}})
    for (const ft::StorageCase& sc : cases)
      for (bool with_z : {true, false}) {
        SCOPED_TRACE(sc.name() + " " + s.str() + (with_z ? " with z" : " without z"));
        BnRun f = make(s, rng);
        const Tensor xs = ft::stored_copy(f.x, sc.dtype, sc.format);
        const Tensor zs = ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format);
        const Tensor rs = ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format);
        f.x = ft::float32_values(xs);
        f.xd = up(xs);
        const Tensor zd = up(zs);
        f.y = up(ft::poisoned_stored(s, sc.dtype, sc.format));
        const float momentum = 0.1f;
        Tensor maskd = up(Tensor::zeros(Shape{(s.numel() + 7) / 8}, DType::U8));
        const bool mask_written =
            kernels::bn_train_add_relu(ctx(), f.xd, with_z ? &zd : nullptr, f.gammad, f.betad, f.eps, momentum,
                                       f.stats, f.mean, f.invstd, f.rmd, f.rvd, f.y, &maskd);
        Tensor gd = up(ft::poisoned_stored(s, sc.dtype, sc.format)), dxd = up(ft::poisoned_stored(s, sc.dtype, sc.format));
        Tensor gsd = poisoned(Shape{2, f.c});
        kernels::bn_backward_relu(ctx(), f.xd, f.y, up(rs), f.mean, f.invstd, f.gammad, mask_written ? &maskd : nullptr,
                                  gsd, gd, dxd);
        const Tensor y = ft::float32_values(down(f.y)), g = ft::float32_values(down(gd));
        const Tensor dx = ft::float32_values(down(dxd)), r = ft::float32_values(rs), z = ft::float32_values(zs);
        const Tensor mean = down(f.mean), invstd = down(f.invstd), rm = down(f.rmd), rv = down(f.rvd);
        const Tensor gs = down(gsd);

        Tensor masked = Tensor::empty(s);
        for (int64_t j = 0; j < y.numel(); ++j) masked.f32()[j] = y.f32()[j] > 0.0f ? r.f32()[j] : 0.0f;
        const BnReference ref(f, masked);
        std::vector<double> m, v;
        naive_moments(f.x, m, v);
        const double u = ft::unit_roundoff(sc.dtype), n = static_cast<double>(f.count);
        for (int64_t c = 0; c < f.c; ++c) {
          EXPECT_NEAR(static_cast<double>(mean.f32()[c]) + mean.f32()[f.c + c], m[c], 1e-5);
          EXPECT_NEAR(invstd.f32()[c], 1.0 / std::sqrt(v[c] + f.eps), 1e-4 / std::sqrt(v[c] + f.eps));
          EXPECT_NEAR(rm.f32()[c], 0.9 * f.running_mean.f32()[c] + 0.1 * m[c], 1e-5);
          EXPECT_NEAR(rv.f32()[c], 0.9 * f.running_var.f32()[c] + 0.1 * v[c] * n / (n - 1), 1e-4);
          EXPECT_NEAR(gs.f32()[c], ref.sdy[c], 1e-4 * std::sqrt(n));
          EXPECT_NEAR(gs.f32()[f.c + c], ref.sdyx[c], 1e-4 * std::sqrt(n));
        }
        int64_t zeros = 0;
        for (int64_t j = 0; j < y.numel(); ++j) {
          const double zv = with_z ? z.f32()[j] : 0.0;
          const double want = std::max(0.0, ref.y[j] + zv);
          // Two roundings where the split kernels store (the normalized value, the sum).
          ASSERT_NEAR(y.f32()[j], want, 2 * u * (std::abs(ref.y[j]) + std::abs(zv)) + 1e-4) << j;
          ASSERT_EQ(g.f32()[j], masked.f32()[j]) << j;
          ASSERT_NEAR(dx.f32()[j], ref.dx[j], u * std::abs(ref.dx[j]) + 1e-3) << j;
          zeros += y.f32()[j] == 0.0f;
        }
        EXPECT_GT(zeros, 0);
        EXPECT_LT(zeros, y.numel());
        if (mask_written) {  // cuDNN's BOOLEAN layout: a bit per element in memory order, the lowest bit first
          const Tensor mask = down(maskd), ys = down(f.y);
          int64_t wrong = 0;
          for (int64_t j = 0; j < y.numel(); ++j) {
            const int64_t m = ft::memory_index(s, ys.format(), j);
            wrong += ((mask.data<uint8_t>()[m / 8] >> (m % 8)) & 1) != (y.f32()[j] > 0.0f ? 1 : 0);
          }
          EXPECT_EQ(wrong, 0) << "of " << y.numel() << " mask bits";
          // With every bit flipped, a backward that reads the mask keeps dy where y is 0; one whose mask graph
          // cuDNN refused reads y (the same g as above). Either way, every element follows the one rule.
          Tensor flipped = mask;
          for (int64_t b = 0; b < flipped.numel(); ++b) flipped.data<uint8_t>()[b] = ~flipped.data<uint8_t>()[b];
          const Tensor flippedd = up(flipped);
          Tensor g2d = up(ft::poisoned_stored(s, sc.dtype, sc.format));
          kernels::bn_backward_relu(ctx(), f.xd, f.y, up(rs), f.mean, f.invstd, f.gammad, &flippedd, gsd, g2d,
                                    dxd);
          const Tensor g2 = ft::float32_values(down(g2d));
          int64_t by_mask = 0, by_y = 0;
          for (int64_t j = 0; j < y.numel(); ++j) {
            by_mask += g2.f32()[j] == (y.f32()[j] > 0.0f ? 0.0f : r.f32()[j]);
            by_y += g2.f32()[j] == masked.f32()[j];
          }
          EXPECT_TRUE(by_mask == y.numel() || by_y == y.numel()) << by_mask << " and " << by_y << " of " << y.numel();
          std::printf("cuDNN batch norm backward read the forward's bit mask: %s\n", by_mask == y.numel() ? "yes" : "no");
        }
      }
}

// Where no fused graph runs (float32 storage on every backend; every
// storage on the CPU) the whole-pass calls are the split kernels bit for
// bit: statistics, running statistics, y, g, the sums and dx.
TEST_P(BatchNormOnBackend, WholeTrainingPassIsTheSplitKernels) {
  std::mt19937_64 rng(72);
  std::vector<ft::StorageCase> cases{{DType::F32, MemoryFormat::Contiguous}, {DType::F32, MemoryFormat::ChannelsLast}};
  if (!on_cuda()) cases = ft::low_storage_cases();
  for (const ft::StorageCase& sc : cases)
    for (DType autocast : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(sc.name() + " autocast " + dtype_name(autocast));
      const Shape s{3, 8, 5, 4};
      BnRun f = make(s, rng);
      f.xd = up(ft::stored_copy(f.x, sc.dtype, sc.format));
      const Tensor zd = up(ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format));
      const Tensor rd = up(ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format));
      auto fresh = [&] { return up(ft::poisoned_stored(s, sc.dtype, sc.format)); };
      ctx().math.autocast = autocast;
      // Split.
      Tensor rm1 = up(f.running_mean), rv1 = up(f.running_var), y1 = fresh(), g1 = fresh(), dx1 = fresh();
      Tensor st1 = poisoned(Shape{3, f.c}, DType::F64), m1 = poisoned(Shape{2, f.c}), i1 = poisoned(Shape{f.c});
      Tensor gs1 = poisoned(Shape{2, f.c});
      kernels::bn_stats(ctx(), f.xd, st1);
      kernels::bn_finalize(ctx(), st1, f.count, f.eps, 0.1f, m1, i1, &rm1, &rv1);
      kernels::bn_apply_add_relu(ctx(), f.xd, m1, i1, f.gammad, f.betad, &zd, y1, autocast);
      kernels::bn_backward_reduce_relu(ctx(), f.xd, y1, rd, m1, i1, gs1, g1);
      kernels::bn_backward_apply(ctx(), f.xd, g1, m1, i1, f.gammad, gs1, f.count, dx1);
      // Whole.
      Tensor rm2 = up(f.running_mean), rv2 = up(f.running_var), y2 = fresh(), g2 = fresh(), dx2 = fresh();
      Tensor st2 = poisoned(Shape{3, f.c}, DType::F64), m2 = poisoned(Shape{2, f.c}), i2 = poisoned(Shape{f.c});
      Tensor gs2 = poisoned(Shape{2, f.c});
      Tensor mask = up(Tensor::zeros(Shape{(s.numel() + 7) / 8}, DType::U8));
      const bool mask_written =
          kernels::bn_train_add_relu(ctx(), f.xd, &zd, f.gammad, f.betad, f.eps, 0.1f, st2, m2, i2, rm2, rv2, y2, &mask, autocast);
      EXPECT_FALSE(mask_written);  // the split kernels keep no mask
      kernels::bn_backward_relu(ctx(), f.xd, y2, rd, m2, i2, f.gammad, nullptr, gs2, g2, dx2);
      ctx().math.autocast = DType::F32;
      const std::vector<std::pair<Tensor, Tensor>> pairs{{st1, st2}, {m1, m2}, {i1, i2}, {rm1, rm2}, {rv1, rv2},
                                                         {y1, y2},   {g1, g2}, {gs1, gs2}, {dx1, dx2}};
      for (size_t k = 0; k < pairs.size(); ++k)
        EXPECT_TRUE(ft::same_bits(down(pairs[k].first), down(pairs[k].second))) << "result " << k;
    }
}

TEST_P(BatchNormOnBackend, FusedAddReluErrorsThrow) {
  std::mt19937_64 rng(70);
  BnRun f = make(Shape{3, 5, 7, 9}, rng);
  forward(f);
  Tensor z_bad = up(ft::random_tensor(Shape{3, 5, 9, 7}, rng));
  try {
    kernels::bn_apply_add_relu(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, &z_bad, f.y);
    FAIL() << "bn_apply_add_relu took a z of another shape";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bn_apply_add_relu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("z"), std::string::npos) << msg;
  }
  EXPECT_THROW(kernels::bn_apply_add_relu(ctx(), f.xd, f.mean, f.invstd, f.gammad, f.betad, nullptr, f.y, DType::I64),
               Error);
  Tensor gs = poisoned(Shape{2, 5}), g_bad = up(ft::random_tensor(Shape{3, 5, 9, 7}, rng));
  EXPECT_THROW(kernels::bn_backward_reduce_relu(ctx(), f.xd, f.y, f.xd, f.mean, f.invstd, gs, g_bad), Error);
  EXPECT_THROW(kernels::bn_backward_reduce_relu(ctx(), f.xd, z_bad, f.xd, f.mean, f.invstd, gs, f.y), Error);
  // One value per channel cannot train; dx over dy is refused.
  Tensor x1 = up(ft::random_tensor(Shape{1, 5, 1, 1}, rng)), y1 = up(ft::random_tensor(Shape{1, 5, 1, 1}, rng));
  EXPECT_THROW(kernels::bn_train_add_relu(ctx(), x1, nullptr, f.gammad, f.betad, f.eps, 0.1f, f.stats, f.mean,
                                          f.invstd, f.rmd, f.rvd, y1, nullptr),
               Error);
  Tensor short_mask = up(Tensor::zeros(Shape{(f.x.numel() + 7) / 8 - 1}, DType::U8));  // a bit short
  try {
    kernels::bn_train_add_relu(ctx(), f.xd, nullptr, f.gammad, f.betad, f.eps, 0.1f, f.stats, f.mean, f.invstd, f.rmd,
                               f.rvd, f.y, &short_mask);
    FAIL() << "bn_train_add_relu took a mask with too few bits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("relu_mask"), std::string::npos) << e.what();
  }
  Tensor dy = up(ft::random_tensor(f.x.shape(), rng)), g = poisoned(f.x.shape());
  EXPECT_THROW(kernels::bn_backward_relu(ctx(), f.xd, f.y, dy, f.mean, f.invstd, f.gammad, nullptr, gs, g, dy), Error);
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
