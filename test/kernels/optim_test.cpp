// Optimizer kernels on every backend against torch.optim's update rules
// computed in float64 (SGD, Adam, AdamW, amsgrad, weight decay), over 6
// steps, on a chunk table of two groups whose ranges interleave and exceed
// one chunk; the sum of squares against a float64 sum; the clamp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/optim.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

FANOUT_BACKEND_SUITE(OptimKernel);

constexpr int64_t kN = 40000;

// Two groups over [0, kN): A = [0, 37) + [53, 20000) (longer than a chunk),
// B = [37, 53) + [20000, kN); each range cut at kUpdateChunk.
struct Groups {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges = {{{0, 37}, {53, 20000}}, {{37, 53}, {20000, kN}}};
  Tensor table(int g) const {
    std::vector<int64_t> v;
    for (auto [b, e] : ranges[g])
      for (int64_t s = b; s < e; s += kernels::kUpdateChunk) {
        v.push_back(s);
        v.push_back(std::min(kernels::kUpdateChunk, e - s));
      }
    Tensor t = Tensor::empty(Shape{static_cast<int64_t>(v.size() / 2), 2}, DType::I64);
    std::copy(v.begin(), v.end(), t.data<int64_t>());
    return t;
  }
  int group_of(int64_t i) const {
    for (int g = 0; g < 2; ++g)
      for (auto [b, e] : ranges[g])
        if (i >= b && i < e) return g;
    return -1;
  }
};

// |got - want| <= rtol * (|want| + mean |want|): relative, with the
// tensor's typical size as a floor where a value crosses zero.
::testing::AssertionResult near_rel(const Tensor& got, const std::vector<double>& want, double rtol) {
  double mean = 0;
  for (double w : want) mean += std::abs(w);
  mean /= static_cast<double>(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got.f32()[i]) - want[i]);
    if (!(d <= rtol * (std::abs(want[i]) + mean)))
      return ::testing::AssertionFailure() << "element " << i << ": " << got.f32()[i] << " vs " << want[i];
  }
  return ::testing::AssertionSuccess();
}

std::vector<double> as_double(const Tensor& t) { return std::vector<double>(t.f32(), t.f32() + t.numel()); }

struct SgdCase {
  const char* name;
  float lr[2], wd[2], momentum, dampening;
  bool nesterov;
};

TEST_P(OptimKernel, SgdMatchesTorchOverSteps) {
  std::mt19937_64 rng(91);
  const SgdCase cases[] = {
      {"plain", {0.1f, 0.05f}, {0, 0}, 0, 0, false},
      {"weight_decay", {0.05f, 0.02f}, {0.01f, 0}, 0, 0, false},
      {"momentum", {0.1f, 0.2f}, {5e-4f, 0}, 0.9f, 0, false},
      {"dampening", {0.1f, 0.1f}, {5e-4f, 1e-2f}, 0.8f, 0.3f, false},
      {"nesterov", {0.05f, 0.1f}, {1e-2f, 0}, 0.9f, 0, true},
  };
  const Groups groups;
  const Tensor t0 = up(groups.table(0)), t1 = up(groups.table(1));
  for (const SgdCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor p = ft::random_tensor(Shape{kN}, rng);
    Tensor pd = up(p), bd = poisoned(Shape{kN});  // the first step must not read the buffer
    std::vector<double> rp = as_double(p), rb(kN, 0.0);
    for (int step = 0; step < 6; ++step) {
      Tensor g = ft::random_tensor(Shape{kN}, rng);
      Tensor gd = up(g);
      for (int k = 0; k < 2; ++k) {
        kernels::SgdStep h{c.lr[k], c.momentum, c.dampening, c.wd[k], c.nesterov, step == 0};
        kernels::sgd_step(ctx(), pd, gd, bd, k == 0 ? t0 : t1, h);
      }
      for (int64_t i = 0; i < kN; ++i) {
        const int k = groups.group_of(i);
        double d = g.f32()[i] + double(c.wd[k]) * rp[i];
        if (c.momentum != 0) {
          rb[i] = step == 0 ? d : double(c.momentum) * rb[i] + (1 - double(c.dampening)) * d;
          d = c.nesterov ? d + double(c.momentum) * rb[i] : rb[i];
        }
        rp[i] -= double(c.lr[k]) * d;
      }
      ASSERT_TRUE(near_rel(down(pd), rp, 1e-6)) << "step " << step;
      if (c.momentum != 0) ASSERT_TRUE(near_rel(down(bd), rb, 1e-6)) << "step " << step;
    }
  }
}

struct AdamCase {
  const char* name;
  bool decoupled, amsgrad;
  float lr[2], wd[2], beta1, beta2, eps;
};

TEST_P(OptimKernel, AdamAndAdamWMatchTorchOverSteps) {
  const AdamCase cases[] = {
      {"adam", false, false, {1e-2f, 3e-3f}, {0, 0}, 0.9f, 0.999f, 1e-8f},
      {"adam_wd", false, false, {1e-2f, 1e-2f}, {1e-2f, 0}, 0.9f, 0.999f, 1e-8f},
      {"adam_amsgrad", false, true, {5e-3f, 1e-2f}, {1e-3f, 0}, 0.8f, 0.99f, 1e-6f},
      {"adamw", true, false, {1e-2f, 2e-2f}, {1e-2f, 0}, 0.9f, 0.999f, 1e-8f},
      {"adamw_amsgrad", true, true, {1e-2f, 5e-3f}, {0.1f, 0.05f}, 0.9f, 0.95f, 1e-8f},
      {"adamw_beta1_above_half_weight", true, false, {1e-2f, 1e-2f}, {1e-2f, 0}, 0.3f, 0.5f, 1e-3f},
  };
  const Groups groups;
  const Tensor t0 = up(groups.table(0)), t1 = up(groups.table(1));
  std::mt19937_64 rng(92);
  for (const AdamCase& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor p = ft::random_tensor(Shape{kN}, rng);
    Tensor pd = up(p), md = up(Tensor::zeros(Shape{kN})), vd = up(Tensor::zeros(Shape{kN}));
    Tensor vmaxd = up(Tensor::zeros(Shape{kN}));
    std::vector<double> rp = as_double(p), rm(kN, 0.0), rv(kN, 0.0), rvmax(kN, 0.0);
    for (int step = 1; step <= 6; ++step) {
      // Gradients of mixed scales, some tiny: the denominator's eps matters there.
      Tensor g = ft::random_tensor(Shape{kN}, rng);
      for (int64_t i = 0; i < kN; i += 7) g.f32()[i] *= 1e-6f;
      Tensor gd = up(g);
      for (int k = 0; k < 2; ++k) {
        const double lr = c.lr[k], wd = c.wd[k];
        kernels::AdamStep h;
        h.weight_decay = c.decoupled ? 0.0f : c.wd[k];
        h.decay = c.decoupled ? static_cast<float>(1.0 - lr * wd) : 1.0f;
        h.one_minus_beta1 = static_cast<float>(1.0 - double(c.beta1));
        h.beta2 = c.beta2;
        h.one_minus_beta2 = static_cast<float>(1.0 - double(c.beta2));
        h.eps = c.eps;
        h.step_size = static_cast<float>(lr / (1.0 - std::pow(double(c.beta1), step)));
        h.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(double(c.beta2), step)));
        h.amsgrad = c.amsgrad;
        Tensor none;
        kernels::adam_step(ctx(), pd, gd, md, vd, c.amsgrad ? vmaxd : none, k == 0 ? t0 : t1, h);
      }
      // torch.optim.Adam(W), single-tensor path, in float64.
      for (int64_t i = 0; i < kN; ++i) {
        const int k = groups.group_of(i);
        const double lr = c.lr[k], wd = c.wd[k], b1 = c.beta1, b2 = c.beta2;
        double gi = g.f32()[i];
        if (c.decoupled) rp[i] *= 1 - lr * wd;
        else gi += wd * rp[i];
        rm[i] = b1 * rm[i] + (1 - b1) * gi;
        rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
        rvmax[i] = std::max(rvmax[i], rv[i]);
        const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
        const double denom = std::sqrt(c.amsgrad ? rvmax[i] : rv[i]) / std::sqrt(bc2) + double(c.eps);
        rp[i] -= lr / bc1 * rm[i] / denom;
      }
      ASSERT_TRUE(near_rel(down(pd), rp, 1e-6)) << "step " << step;
      ASSERT_TRUE(near_rel(down(md), rm, 1e-6)) << "step " << step;
      ASSERT_TRUE(near_rel(down(vd), rv, 1e-6)) << "step " << step;
      if (c.amsgrad) ASSERT_TRUE(near_rel(down(vmaxd), rvmax, 1e-6)) << "step " << step;
    }
  }
}

// Elements no chunk names are never touched, whatever the state holds there.
TEST_P(OptimKernel, ElementsOutsideTheChunksStayPut) {
  std::mt19937_64 rng(93);
  const int64_t n = 100;
  Tensor table = Tensor::empty(Shape{2, 2}, DType::I64);
  const int64_t pairs[] = {10, 20, 50, 5};  // [10, 30) and [50, 55)
  std::copy(std::begin(pairs), std::end(pairs), table.data<int64_t>());
  const Tensor t = up(table);
  Tensor p = ft::random_tensor(Shape{n}, rng), g = ft::random_tensor(Shape{n}, rng);
  const Tensor m0 = ft::random_tensor(Shape{n}, rng), v0 = ft::random_tensor(Shape{n}, rng, 0.1f, 1.0f);
  const Tensor b0 = ft::random_tensor(Shape{n}, rng), vmax0 = ft::random_tensor(Shape{n}, rng, 0.1f, 1.0f);
  Tensor pd = up(p), gd = up(g), m = up(m0), v = up(v0), buf = up(b0), vmax = up(vmax0);
  kernels::AdamStep h;
  h.step_size = 0.1f;
  h.amsgrad = true;
  kernels::sgd_step(ctx(), pd, gd, buf, t, {0.5f, 0.9f, 0.0f, 0.0f, false, false});
  kernels::adam_step(ctx(), pd, gd, m, v, vmax, t, h);
  const Tensor got = down(pd);
  const Tensor after[] = {down(buf), down(m), down(v), down(vmax)};
  const Tensor* before[] = {&b0, &m0, &v0, &vmax0};
  for (int64_t i = 0; i < n; ++i) {
    const bool inside = (i >= 10 && i < 30) || (i >= 50 && i < 55);
    if (inside) EXPECT_NE(got.f32()[i], p.f32()[i]) << i;
    else EXPECT_EQ(got.f32()[i], p.f32()[i]) << i;
    for (int k = 0; k < 3; ++k)  // buffer, exp_avg and exp_avg_sq change inside (vmax only where v grows)
      if (inside) EXPECT_NE(after[k].f32()[i], before[k]->f32()[i]) << "state " << k << " at " << i;
    for (int k = 0; k < 4; ++k)
      if (!inside) EXPECT_EQ(after[k].f32()[i], before[k]->f32()[i]) << "state " << k << " at " << i;
  }
}

TEST_P(OptimKernel, SumOfSquaresIsTheFloat64Sum) {
  std::mt19937_64 rng(94);
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20, (int64_t{1} << 20) + 37}) {
    Tensor x = ft::random_tensor(Shape{n}, rng, -3.0f, 3.0f);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += double(x.f32()[i]) * x.f32()[i];
    const Tensor xd = up(x);
    const double got = kernels::sum_squares(ctx(), xd);
    EXPECT_NEAR(got, want, 1e-12 * want) << "n " << n;
  }
  // Zeros, huge values (whose squares overflow float but not double), and non-finite ones.
  Tensor z = up(Tensor::zeros(Shape{513}));
  EXPECT_EQ(kernels::sum_squares(ctx(), z), 0.0);
  Tensor big = Tensor::empty(Shape{3});
  big.f32()[0] = 3e38f;
  big.f32()[1] = -3e38f;
  big.f32()[2] = 1.0f;
  Tensor bigd = up(big);
  const double b0 = big.f32()[0];
  EXPECT_NEAR(kernels::sum_squares(ctx(), bigd), 2 * b0 * b0 + 1, 1e-12 * b0 * b0);
  big.f32()[2] = std::numeric_limits<float>::quiet_NaN();
  bigd = up(big);
  EXPECT_TRUE(std::isnan(kernels::sum_squares(ctx(), bigd)));
  big.f32()[2] = std::numeric_limits<float>::infinity();
  bigd = up(big);
  EXPECT_TRUE(std::isinf(kernels::sum_squares(ctx(), bigd)));
}

TEST_P(OptimKernel, ClampAbsClampsAsTorchClamp) {
  Tensor x = Tensor::empty(Shape{7});
  const float in[] = {-3.0f, -0.5f, 0.0f, 0.25f, 2.0f, std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()};
  std::copy(std::begin(in), std::end(in), x.f32());
  Tensor xd = up(x);
  kernels::clamp_abs(ctx(), xd, 1.0f);
  const Tensor got = down(xd);
  const float want[] = {-1.0f, -0.5f, 0.0f, 0.25f, 1.0f, 1.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got.f32()[i], want[i]) << i;
  EXPECT_TRUE(std::isnan(got.f32()[6]));
}

TEST_P(OptimKernel, RefusesBadArguments) {
  Tensor p = up(Tensor::zeros(Shape{10})), g = up(Tensor::zeros(Shape{9})), none;
  Tensor table = Tensor::empty(Shape{1, 2}, DType::I64);
  table.data<int64_t>()[0] = 0;
  table.data<int64_t>()[1] = 10;
  const Tensor t = up(table);
  EXPECT_THROW(kernels::sgd_step(ctx(), p, g, none, t, {0.1f}), Error);  // numel differs
  Tensor g10 = up(Tensor::zeros(Shape{10}));
  EXPECT_THROW(kernels::sgd_step(ctx(), p, g10, none, t, {0.1f, 0.0f, 0.0f, 0.0f, true}), Error);  // nesterov
  EXPECT_THROW(kernels::sgd_step(ctx(), p, g10, none, t, {-0.1f}), Error);
  EXPECT_THROW(kernels::sgd_step(ctx(), p, g10, none, up(Tensor::zeros(Shape{1, 2})), {0.1f}), Error);  // not I64
  kernels::AdamStep h;
  h.amsgrad = true;
  EXPECT_THROW(kernels::adam_step(ctx(), p, g10, g10, g10, none, t, h), Error);  // amsgrad without its state
  EXPECT_THROW(kernels::clamp_abs(ctx(), p, -1.0f), Error);
  if (!on_cuda()) {
    table.data<int64_t>()[1] = 11;  // past the arena
    EXPECT_THROW(kernels::sgd_step(ctx(), p, g10, none, table, {0.1f}), Error);
  }
}

}  // namespace
}  // namespace fanout
