// Mean squared error by rows (PyTorch's MSELoss, reduction = mean), plane
// argmax (torch.argmax order) and the criteria built on them, on every
// backend against float64 references and hand-computed values.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"
#include "runtime/nn/criterion.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;
using ::testing::HasSubstr;

class MseOnBackend : public testing::BackendTest {};
FANOUT_ON_EVERY_BACKEND(MseOnBackend);

TEST_P(MseOnBackend, RowLossesAndGradientAgainstFloat64) {
  std::mt19937_64 rng(5);
  for (const Shape& s : {Shape{1, 1}, Shape{3, 7}, Shape{4, 2, 5, 6}, Shape{2, 3, 4, 5, 7}, Shape{5, 1100}}) {
    SCOPED_TRACE(s.str());
    const Tensor o = ft::random_tensor(s, rng, -3, 3), t = ft::random_tensor(s, rng, -1, 2);
    const int64_t n = s[0], e = s.numel() / n;
    const float scale = 0.37f;
    Tensor rows = poisoned(Shape{n}), grad = poisoned(s);
    kernels::mse_forward(ctx(), up(o), up(t), scale, rows, &grad);
    std::vector<double> want_rows(n), want_grad(s.numel());
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int64_t j = i * e; j < (i + 1) * e; ++j) {
        const double d = double(o.f32()[j]) - t.f32()[j];
        sum += d * d;
        want_grad[j] = scale * 2.0 * d / double(e);
      }
      want_rows[i] = sum / double(e);
    }
    EXPECT_TRUE(matches(down(rows), want_rows, 1e-6, 1e-6));
    EXPECT_TRUE(matches(down(grad), want_grad, 1e-6, 1e-6));
    // Without a gradient only the rows are written.
    Tensor rows2 = poisoned(Shape{n});
    kernels::mse_forward(ctx(), up(o), up(t), scale, rows2, nullptr);
    EXPECT_TRUE(matches(down(rows2), want_rows, 1e-6, 1e-6));
  }
}

TEST_P(MseOnBackend, HandComputedRow) {
  Tensor o = Tensor::empty(Shape{1, 2}), t = Tensor::empty(Shape{1, 2});
  o.f32()[0] = 1.5f;
  o.f32()[1] = -2.0f;
  t.f32()[0] = 0.5f;
  t.f32()[1] = 1.0f;
  Tensor rows = poisoned(Shape{1}), grad = poisoned(Shape{1, 2});
  kernels::mse_forward(ctx(), up(o), up(t), 1.0f, rows, &grad);
  // ((1)^2 + (-3)^2) / 2 = 5; d/do = 2 (o - t) / 2.
  EXPECT_TRUE(matches(down(rows), {5.0}, 0, 0));
  EXPECT_TRUE(matches(down(grad), {1.0, -3.0}, 0, 0));
}

TEST_P(MseOnBackend, GradientMatchesCentralDifferences) {
  std::mt19937_64 rng(6);
  const Shape s{3, 2, 3, 3};
  const Tensor o = ft::random_tensor(s, rng, -2, 2), t = ft::random_tensor(s, rng, -2, 2);
  Tensor rows = poisoned(Shape{3}), grad = poisoned(s);
  kernels::mse_forward(ctx(), up(o), up(t), 1.0f / 3, rows, &grad);
  const Tensor g = down(grad);
  // The loss scale * sum of the rows' mean squared errors, in float64.
  auto loss = [&](const Tensor& x) {
    double sum = 0;
    const int64_t e = s.numel() / 3;
    for (int64_t j = 0; j < s.numel(); ++j) {
      const double d = double(x.f32()[j]) - t.f32()[j];
      sum += d * d / double(e);
    }
    return sum / 3;
  };
  for (int64_t j = 0; j < s.numel(); j += 5) {
    Tensor p = ft::clone(o), m = ft::clone(o);
    const float h = 1e-2f;
    p.f32()[j] += h;
    m.f32()[j] -= h;
    const double num = (loss(p) - loss(m)) / (double(p.f32()[j]) - m.f32()[j]);
    EXPECT_NEAR(g.f32()[j], num, 1e-5) << "element " << j;
  }
}

TEST_P(MseOnBackend, ShapeMismatchesThrow) {
  std::mt19937_64 rng(12);
  Tensor o = up(ft::random_tensor(Shape{2, 3}, rng)), t = up(ft::random_tensor(Shape{2, 4}, rng));
  Tensor rows = poisoned(Shape{2}), bad_rows = poisoned(Shape{3});
  EXPECT_THROW(kernels::mse_forward(ctx(), o, t, 1, rows, nullptr), Error);
  EXPECT_THROW(kernels::mse_forward(ctx(), o, o, 1, bad_rows, nullptr), Error);
  Tensor bad_grad = poisoned(Shape{2, 2});
  EXPECT_THROW(kernels::mse_forward(ctx(), o, o, 1, rows, &bad_grad), Error);
}

class PlaneArgmaxOnBackend : public testing::BackendTest {};
FANOUT_ON_EVERY_BACKEND(PlaneArgmaxOnBackend);

TEST_P(PlaneArgmaxOnBackend, FirstMaximumAndFirstNanAgainstNaive) {
  std::mt19937_64 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto [p, s] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {12, 4096}, {3, 70001}}) {
    SCOPED_TRACE(::testing::Message() << p << " planes of " << s);
    Tensor x = ft::random_tensor(Shape{p, s}, rng, -5, 5);
    // Plane 0: a tie of maxima (the first wins); plane 1: NaNs (the first wins); the rest random.
    if (s > 3) {
      x.f32()[2] = x.f32()[s - 1] = 9.0f;
      if (p > 1) x.f32()[s + 1] = x.f32()[s + 3] = nan;
    }
    Tensor idx = poisoned(Shape{p}, DType::I32), val = poisoned(Shape{p});
    kernels::plane_argmax(ctx(), up(x), idx, val);
    const Tensor ih = down(idx), vh = down(val);
    for (int64_t i = 0; i < p; ++i) {
      const float* v = x.f32() + i * s;
      int64_t best = 0;
      for (int64_t j = 0; j < s; ++j) {
        if (std::isnan(v[j])) {
          best = j;
          break;
        }
        if (v[j] > v[best]) best = j;
      }
      EXPECT_EQ(ih.data<int32_t>()[i], best) << "plane " << i;
      if (std::isnan(v[best])) EXPECT_TRUE(std::isnan(vh.f32()[i]));
      else EXPECT_EQ(vh.f32()[i], v[best]);
    }
    if (s > 3) EXPECT_EQ(ih.data<int32_t>()[0], 2);
    if (s > 3 && p > 1) EXPECT_EQ(ih.data<int32_t>()[1], 1);
  }
}

TEST_P(PlaneArgmaxOnBackend, ShapeErrorsThrow) {
  std::mt19937_64 rng(13);
  Tensor x = up(ft::random_tensor(Shape{2, 3}, rng));
  Tensor idx = poisoned(Shape{2}, DType::I32), val = poisoned(Shape{2}), bad = poisoned(Shape{3}, DType::I32);
  Tensor fidx = poisoned(Shape{2});
  EXPECT_THROW(kernels::plane_argmax(ctx(), x, bad, val), Error);
  EXPECT_THROW(kernels::plane_argmax(ctx(), x, fidx, val), Error);
  EXPECT_THROW(kernels::plane_argmax(ctx(), x.view(Shape{6}), idx, val), Error);
}

class CriterionOnBackend : public testing::BackendTest {};
FANOUT_ON_EVERY_BACKEND(CriterionOnBackend);

// A (N, C, D, H, W) volume of small noise with one peak per (row, channel) at `at`.
Tensor volume_with_peaks(const Shape& s, const std::vector<std::array<int64_t, 3>>& at, std::mt19937_64& rng) {
  Tensor v = ft::random_tensor(s, rng, 0.0f, 0.1f);
  const int64_t planes = s[0] * s[1];
  for (int64_t p = 0; p < planes; ++p) {
    const auto& c = at[static_cast<size_t>(p)];
    if (c[0] < 0) continue;
    v.f32()[((p * s[2] + c[0]) * s[3] + c[1]) * s[4] + c[2]] = 1.0f;
  }
  return v;
}

TEST_P(CriterionOnBackend, MseScoresHeatmapPeaks) {
  std::mt19937_64 rng(8);
  const Shape s{2, 2, 6, 7, 8};
  // Predicted and true peaks of the four (row, channel) planes: distances 0, 1, sqrt(4+4+1) = 3, and a
  // target without a peak (all zero: not scored).
  const Tensor out = volume_with_peaks(s, {{{1, 2, 3}}, {{0, 0, 0}}, {{5, 6, 7}}, {{2, 2, 2}}}, rng);
  Tensor target = volume_with_peaks(s, {{{1, 2, 3}}, {{0, 1, 0}}, {{3, 4, 6}}, {{-1, 0, 0}}}, rng);
  const int64_t plane = s.numel() / 4;
  for (int64_t j = 3 * plane; j < 4 * plane; ++j) target.f32()[j] = 0.0f;
  auto c = make_criterion({CriterionKind::Mse, 0.0f});
  EXPECT_TRUE(c->dense_targets());
  c->forward(ctx(), up(out), up(target), true, 0.5f);
  const StepResult r = c->read(ctx());
  EXPECT_EQ(r.count, 2);
  EXPECT_EQ(r.sums[kPointsSum].value(), 3);
  EXPECT_EQ(r.sums[kNearSum].value(), 2);
  EXPECT_NEAR(r.sums[kDistanceSum].value(), 0 + 1 + 3, 1e-6);
  // The loss: the rows' mean squared errors, summed.
  double want = 0;
  for (int64_t j = 0; j < s.numel(); ++j) {
    const double d = double(out.f32()[j]) - target.f32()[j];
    want += d * d / double(s.numel() / 2);
  }
  EXPECT_NEAR(r.loss_sum, want, 1e-6 * want);
  EXPECT_EQ(c->grad().shape(), s);
}

TEST_P(CriterionOnBackend, MseOnFlatOutputsHasNoHeatmapScore) {
  std::mt19937_64 rng(9);
  const Tensor out = ft::random_tensor(Shape{4, 6}, rng), target = ft::random_tensor(Shape{4, 6}, rng);
  auto c = make_criterion({CriterionKind::Mse, 0.0f});
  c->forward(ctx(), up(out), up(target), false, 0.0f);
  const StepResult r = c->read(ctx());
  EXPECT_EQ(r.count, 4);
  EXPECT_EQ(r.sums[kPointsSum].value(), 0);
  EXPECT_GT(r.loss_sum, 0);
}

TEST_P(CriterionOnBackend, CrossEntropyCountsAndSumsRows) {
  std::mt19937_64 rng(10);
  const Tensor z = ft::random_tensor(Shape{9, 5}, rng, -3, 3), y = ft::random_labels(9, 5, rng);
  auto c = make_criterion({CriterionKind::CrossEntropy, 0.1f});
  EXPECT_FALSE(c->dense_targets());
  c->forward(ctx(), up(z), up(y), true, 1.0f / 9);
  const StepResult r = c->read(ctx());
  Tensor zd = up(z), yd = up(y), loss = poisoned(Shape{1}), correct = poisoned(Shape{1}, DType::I32);
  kernels::XentOutputs o;
  o.correct = &correct;
  kernels::softmax_xent(ctx(), zd, yd, 0.1f, loss, o);
  EXPECT_EQ(r.count, 9);
  EXPECT_EQ(r.sums[kCorrectSum].value(), down(correct).data<int32_t>()[0]);
  EXPECT_NEAR(r.loss_sum / 9, down(loss).f32()[0], 1e-5);
  auto twin = c->clone();
  twin->forward(ctx(), up(z), up(y), false, 0.0f);
  const StepResult r2 = twin->read(ctx());
  EXPECT_EQ(r2.loss_sum, r.loss_sum);
}

TEST_P(CriterionOnBackend, WrongTargetsAreOneLineErrors) {
  auto xent = make_criterion({CriterionKind::CrossEntropy, 0.0f});
  auto mse = make_criterion({CriterionKind::Mse, 0.0f});
  std::mt19937_64 rng(14);
  const Tensor out = up(ft::random_tensor(Shape{2, 3}, rng));
  const Tensor dense = up(ft::random_tensor(Shape{2, 3}, rng));
  const Tensor labels = up(ft::random_labels(2, 3, rng));
  try {
    xent->forward(ctx(), out, dense, false, 0);
    FAIL() << "dense targets for cross_entropy";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("int32 class indices"));
  }
  try {
    mse->forward(ctx(), out, labels, false, 0);
    FAIL() << "labels for mse";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("must be float32 of the output's shape"));
  }
}

TEST(Criterion, BadOptionsAreOneLineErrors) {
  EXPECT_THROW(make_criterion({CriterionKind::CrossEntropy, 1.01f}), Error);
  EXPECT_THROW(make_criterion({CriterionKind::CrossEntropy, -0.1f}), Error);
  EXPECT_NO_THROW(make_criterion({CriterionKind::CrossEntropy, 1.0f})) << "torch's range is [0, 1]";
  EXPECT_THROW(make_criterion({CriterionKind::Mse, 0.1f}), Error);
}

TEST(StepResult, MergeIsExactInAnyOrder) {
  std::mt19937_64 rng(11);
  std::vector<StepResult> parts(5);
  double counted = 0;  // the integer sum's expected value
  for (auto& p : parts) {
    for (int i = 0; i < 7; ++i) {
      p.loss.add(static_cast<float>(rng() % 1000) * 1e-3f + 1e-7f);
      p.sums[kDistanceSum].add(std::sqrt(static_cast<float>(rng() % 50)));
      p.sums[1].add(static_cast<float>(rng() % 1000) * 1e-3f + 1e-7f);
    }
    const int64_t n = static_cast<int64_t>(rng() % 7);
    p.sums[0].add(static_cast<float>(n));
    counted += static_cast<double>(n);
    p.count = 7;
  }
  StepResult a, b;
  for (size_t i = 0; i < parts.size(); ++i) a.merge(parts[i]);
  for (size_t i = parts.size(); i-- > 0;) b.merge(parts[i]);
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.count, 35);
  for (int i = 0; i < kMetricSums; ++i) EXPECT_EQ(a.sums[i].slots(), b.sums[i].slots()) << "sum " << i;
  EXPECT_EQ(a.sums[0].value(), counted);
}

}  // namespace
}  // namespace fanout
