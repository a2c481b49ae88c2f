// Softmax cross-entropy (PyTorch's CrossEntropyLoss with label smoothing,
// reduction = mean) on every backend against a double reference and
// hand-computed values; numerical stability; central-difference gradients
// with and without smoothing; accuracy counting (ties, NaN); label range
// (CPU throws, CUDA reports NaN) and shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// Mean over rows of (1 - s) * (-log p_y) + s * mean_k(-log p_k), in double.
double naive_xent(const Tensor& z, const Tensor& labels, double s, std::vector<double>* probs = nullptr) {
  const int64_t n = z.size(0), k = z.size(1);
  double total = 0;
  if (probs) probs->assign(n * k, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    double m = -1e300;
    for (int64_t j = 0; j < k; ++j) m = std::max(m, double(z.f32()[i * k + j]));
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(z.f32()[i * k + j] - m);
    double smooth = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double logp = z.f32()[i * k + j] - m - std::log(sum);
      smooth += -logp / k;
      if (probs) (*probs)[i * k + j] = std::exp(logp);
    }
    const int32_t y = labels.data<int32_t>()[i];
    const double nll = -(z.f32()[i * k + y] - m - std::log(sum));
    total += (1 - s) * nll + s * smooth;
  }
  return total / n;
}

// torch.argmax per row: first maximum wins, NaN counts as the maximum.
int32_t naive_count_correct(const Tensor& z, const Tensor& labels) {
  const int64_t n = z.size(0), k = z.size(1);
  int32_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = -1;
    for (int64_t j = 0; j < k && best < 0; ++j)
      if (std::isnan(z.f32()[i * k + j])) best = j;
    if (best < 0) {
      best = 0;
      for (int64_t j = 1; j < k; ++j)
        if (z.f32()[i * k + j] > z.f32()[i * k + best]) best = j;
    }
    hits += best == labels.data<int32_t>()[i] ? 1 : 0;
  }
  return hits;
}

FANOUT_BACKEND_SUITE(SoftmaxXentOnBackend);
FANOUT_BACKEND_SUITE(CountCorrect);

TEST_P(SoftmaxXentOnBackend, HandComputedValues) {
  Tensor z = Tensor::empty(Shape{1, 3}), labels = Tensor::empty(Shape{1}, DType::I32);
  z.f32()[0] = 1.0f;
  z.f32()[1] = 2.0f;
  z.f32()[2] = 3.0f;
  labels.data<int32_t>()[0] = 0;
  Tensor zd = up(z), yd = up(labels), probs = poisoned(Shape{1, 3}), loss = poisoned(Shape{1});
  // lse = log(e + e^2 + e^3) = 3.40760596; -log p_0 = lse - 1; mean_k(-log p_k) = lse - 2.
  kernels::softmax_xent_forward(ctx(), zd, yd, 0.0f, probs, loss);
  EXPECT_NEAR(down(loss).f32()[0], 2.40760596, 1e-6);
  kernels::softmax_xent_forward(ctx(), zd, yd, 0.1f, probs, loss);
  EXPECT_NEAR(down(loss).f32()[0], 0.9 * 2.40760596 + 0.1 * 1.40760596, 1e-6);
  const Tensor p = down(probs);
  EXPECT_NEAR(p.f32()[0], 0.09003057, 1e-7);
  EXPECT_NEAR(p.f32()[2], 0.66524096, 1e-7);
}

TEST_P(SoftmaxXentOnBackend, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(81);
  for (float s : {0.0f, 0.1f, 0.3f})
    for (auto [n, k] : {std::pair<int64_t, int>{7, 11}, {37, 10}, {3, 2}, {5, 1000}, {1029, 33}}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << " smoothing " << s);
      Tensor z = ft::random_tensor(Shape{n, k}, rng, -4.0f, 4.0f), labels = ft::random_labels(n, k, rng);
      Tensor zd = up(z), yd = up(labels);
      Tensor probsd = poisoned(Shape{n, k}), lossd = poisoned(Shape{1}), dzd = poisoned(Shape{n, k});
      kernels::softmax_xent_forward(ctx(), zd, yd, s, probsd, lossd);
      const float scale = 1.0f / static_cast<float>(n);
      kernels::softmax_xent_backward(ctx(), probsd, yd, s, scale, dzd);
      const Tensor probs = down(probsd), loss = down(lossd), dz = down(dzd);
      std::vector<double> rp;
      const double ref = naive_xent(z, labels, s, &rp);
      EXPECT_NEAR(loss.f32()[0], ref, 1e-5 * std::max(1.0, ref));
      for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(probs.f32()[i], rp[i], tol(1e-6, 1e-5)) << i;
      // n * dlogits against probs - target: the gradient of the mean loss, at scale 1.
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const double target = (1 - s) * (labels.data<int32_t>()[i] == j ? 1.0 : 0.0) + double(s) / k;
          ASSERT_NEAR(double(dz.f32()[i * k + j]) * n, rp[i * k + j] - target, tol(1e-6, 1e-5))
              << i << " " << j;
        }
      EXPECT_GT(ft::l2_norm(dz), 0.0);

      // dlogits may alias probs.
      kernels::softmax_xent_backward(ctx(), probsd, yd, s, scale, probsd);
      EXPECT_TRUE(ft::same_bits(down(probsd), dz)) << "dlogits in place";

      if (n * k > 100) continue;  // central differences on the small case
      // dlogits with scale = 1 / N is the gradient of the mean loss.
      Tensor p2 = poisoned(Shape{n, k}), l2 = poisoned(Shape{1});
      auto f = [&] {
        Tensor ze = up(z);
        kernels::softmax_xent_forward(ctx(), ze, yd, s, p2, l2);
        return static_cast<double>(down(l2).f32()[0]);
      };
      auto res = ft::grad_check_detail(f, z, dz, 1e-2);
      EXPECT_LT(res.worst, 2e-2);
      EXPECT_EQ(res.checked, n * k);
    }
}

TEST_P(SoftmaxXentOnBackend, StableForLargeLogits) {
  std::mt19937_64 rng(82);
  const int64_t n = 5, k = 10;
  Tensor z = ft::random_tensor(Shape{n, k}, rng, -3.0f, 3.0f), labels = ft::random_labels(n, k, rng);
  for (int64_t i = 0; i < n * k; ++i) z.f32()[i] += (i % 2 ? 1000.0f : -1000.0f);
  Tensor zd = up(z), yd = up(labels), probsd = poisoned(Shape{n, k}), lossd = poisoned(Shape{1});
  kernels::softmax_xent_forward(ctx(), zd, yd, 0.1f, probsd, lossd);
  const Tensor probs = down(probsd), loss = down(lossd);
  EXPECT_TRUE(std::isfinite(loss.f32()[0]));
  EXPECT_NEAR(loss.f32()[0], naive_xent(z, labels, 0.1), 1e-3);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += probs.f32()[i * k + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST_P(SoftmaxXentOnBackend, LabelOutOfRangeGivesNanLossOnCuda) {
  if (!on_cuda()) GTEST_SKIP() << "the CPU throws instead (SoftmaxXent.LabelOutOfRangeThrowsOneLine)";
  std::mt19937_64 rng(20);
  const int64_t n = 9;
  const int k = 10;
  Tensor labels = ft::random_labels(n, k, rng);
  for (int32_t bad : {-2, k, 1000}) {  // -1 is the ignored label
    SCOPED_TRACE(bad);
    labels.data<int32_t>()[4] = bad;
    Tensor zd = up(ft::random_tensor(Shape{n, k}, rng)), yd = up(labels);
    Tensor pd = poisoned(Shape{n, k}), lossd = up(Tensor::zeros(Shape{1}));
    kernels::softmax_xent_forward(ctx(), zd, yd, 0.0f, pd, lossd);
    EXPECT_TRUE(std::isnan(down(lossd).f32()[0]));
    const Tensor probs = down(pd);
    for (int64_t i = 0; i < n * k; ++i) EXPECT_FALSE(std::isnan(probs.f32()[i])) << "probs do not need the label";
    Tensor dld = up(Tensor::zeros(Shape{n, k}));
    kernels::softmax_xent_backward(ctx(), pd, yd, 0.0f, 1.0f, dld);
    const Tensor dl = down(dld);
    EXPECT_TRUE(std::isnan(dl.f32()[4 * k])) << "the bad row's gradient is NaN";
    EXPECT_FALSE(std::isnan(dl.f32()[0])) << "other rows are finite";
  }
}

// Label -1 (kernels::kIgnoreLabel, torch's ignore_index as nanoGPT sets it):
// the row's loss and gradient are 0 and the mean is over the other rows
// (NaN when every row is ignored, as torch's).
TEST_P(SoftmaxXentOnBackend, IgnoredRowsHaveNoLossOrGradient) {
  std::mt19937_64 rng(24);
  const int64_t n = 7, k = 9;
  Tensor z = ft::random_tensor(Shape{n, k}, rng, -3.0f, 3.0f), labels = ft::random_labels(n, k, rng);
  for (int64_t i : {1, 4, 5}) labels.data<int32_t>()[i] = kernels::kIgnoreLabel;
  Tensor zd = up(z), yd = up(labels), pd = poisoned(Shape{n, k}), lossd = poisoned(Shape{1}), rows = poisoned(Shape{n});
  kernels::softmax_xent_forward(ctx(), zd, yd, 0.1f, pd, lossd, &rows);
  Tensor dld = poisoned(Shape{n, k});
  kernels::softmax_xent_backward(ctx(), pd, yd, 0.1f, 0.5f, dld);
  const Tensor rl = down(rows), dl = down(dld);
  double total = 0;
  int counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int y = labels.data<int32_t>()[i];
    double mx = -1e300, sum = 0, mean_logit = 0;
    for (int64_t j = 0; j < k; ++j) mx = std::max(mx, double(z.f32()[i * k + j]));
    for (int64_t j = 0; j < k; ++j) sum += std::exp(double(z.f32()[i * k + j]) - mx), mean_logit += z.f32()[i * k + j];
    const double lse = std::log(sum) + mx;
    if (y == kernels::kIgnoreLabel) {
      EXPECT_EQ(rl.f32()[i], 0.0f) << "row " << i;
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(dl.f32()[i * k + j], 0.0f) << "row " << i;
      continue;
    }
    const double want = 0.9 * (lse - z.f32()[i * k + y]) + 0.1 * (lse - mean_logit / k);
    EXPECT_NEAR(rl.f32()[i], want, 1e-5 * std::abs(want)) << "row " << i;
    for (int64_t j = 0; j < k; ++j) {
      const double p = std::exp(double(z.f32()[i * k + j]) - lse);
      const double g = 0.5 * (p - 0.1 / k - (j == y ? 0.9 : 0.0));
      EXPECT_NEAR(dl.f32()[i * k + j], g, 1e-6) << "row " << i << " column " << j;
    }
    total += want;
    ++counted;
  }
  EXPECT_NEAR(down(lossd).f32()[0], total / counted, 1e-5 * total / counted);
  for (int64_t i = 0; i < n; ++i) labels.data<int32_t>()[i] = kernels::kIgnoreLabel;
  Tensor all = up(labels);
  kernels::softmax_xent_forward(ctx(), zd, all, 0.0f, pd, lossd);
  EXPECT_TRUE(std::isnan(down(lossd).f32()[0])) << "the mean of no rows";
}

TEST_P(CountCorrect, FirstMaximumWins) {
  Tensor z = Tensor::zeros(Shape{4, 3}), labels = Tensor::empty(Shape{4}, DType::I32);
  // Row 0: max at 2. Row 1: tie between 0 and 1 -> 0. Row 2: all equal -> 0. Row 3: max at 1.
  const float v[12] = {0, 1, 2, 5, 5, 1, 3, 3, 3, -1, 4, 2};
  std::copy(v, v + 12, z.f32());
  const int32_t y[4] = {2, 1, 0, 1};  // correct, wrong (tie goes to 0), correct, correct
  std::copy(y, y + 4, labels.data<int32_t>());
  Tensor zd = up(z), yd = up(labels), correct = poisoned(Shape{1}, DType::I32);
  kernels::count_correct(ctx(), zd, yd, correct);
  EXPECT_EQ(down(correct).data<int32_t>()[0], 3);
}

TEST_P(CountCorrect, TiesAndNanAgainstNaive) {
  for (int k : {1, 3, 10, 77}) {
    SCOPED_TRACE(k);
    std::mt19937_64 rng(30 + static_cast<uint64_t>(k));
    const int64_t n = 1031;
    Tensor logits = ft::random_tensor(Shape{n, k}, rng);
    // Few distinct values: many ties (first maximum wins); some NaN rows.
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = std::round(logits.f32()[i] * 1.5f);
    for (int64_t r = 0; r < n; r += 17) logits.f32()[r * k + (r % k)] = std::numeric_limits<float>::quiet_NaN();
    Tensor labels = ft::random_labels(n, k, rng);
    Tensor zd = up(logits), yd = up(labels), cd = poisoned(Shape{1}, DType::I32);
    kernels::count_correct(ctx(), zd, yd, cd);
    const int32_t want = naive_count_correct(logits, labels);
    EXPECT_EQ(down(cd).data<int32_t>()[0], want);
    EXPECT_GT(want, 0);
  }
}

TEST(SoftmaxXent, LabelOutOfRangeThrowsOneLine) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(83);
  Tensor z = ft::random_tensor(Shape{3, 5}, rng), labels = ft::random_labels(3, 5, rng);
  Tensor probs = Tensor::empty(Shape{3, 5}), loss = Tensor::empty(Shape{1});
  for (int32_t bad : {5, -2, 1000}) {  // -1 is the ignored label
    labels.data<int32_t>()[1] = bad;
    try {
      kernels::softmax_xent_forward(ctx, z, labels, 0.0f, probs, loss);
      FAIL() << "label " << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    }
    EXPECT_THROW(kernels::softmax_xent_backward(ctx, probs, labels, 0.0f, 1.0f, probs), Error);
  }
}

TEST_P(SoftmaxXentOnBackend, ShapeErrorsThrow) {
  Context& ctx = this->ctx();
  Tensor z = up(Tensor::zeros(Shape{3, 5})), labels = up(Tensor::zeros(Shape{4}, DType::I32));
  Tensor probs = up(Tensor::empty(Shape{3, 5})), loss = up(Tensor::empty(Shape{1}));
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels, 0.0f, probs, loss), Error);
  Tensor labels3 = up(Tensor::zeros(Shape{3}, DType::I32)), labels_f = up(Tensor::zeros(Shape{3}));
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels_f, 0.0f, probs, loss), Error);
  Tensor probs_bad = up(Tensor::empty(Shape{3, 4}));
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 0.0f, probs_bad, loss), Error);
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 1.5f, probs, loss), Error);
  Tensor correct_f = up(Tensor::empty(Shape{1}));
  EXPECT_THROW(kernels::count_correct(ctx, z, labels3, correct_f), Error);
  EXPECT_NO_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 0.0f, probs, loss));
}

}  // namespace
}  // namespace fanout
