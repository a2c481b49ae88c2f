// Softmax cross-entropy (PyTorch's CrossEntropyLoss with label smoothing,
// reduction = mean) on every backend against a double reference and
// hand-computed values: the loss, row losses, accuracy count (ties, NaN) and
// gradient of one call, narrow and wide rows, low-type logits and gradients,
// in place; numerical stability; central differences with and without
// smoothing; label range (CPU throws, CUDA reports NaN) and shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/loss.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// torch.argmax of row i: the first NaN, else the first maximum.
int64_t naive_argmax(const Tensor& z, int64_t i) {
  const int64_t k = z.size(1);
  for (int64_t j = 0; j < k; ++j)
    if (std::isnan(z.f32()[i * k + j])) return j;
  int64_t best = 0;
  for (int64_t j = 1; j < k; ++j)
    if (z.f32()[i * k + j] > z.f32()[i * k + best]) best = j;
  return best;
}

int32_t naive_count_correct(const Tensor& z, const Tensor& labels) {
  int32_t hits = 0;
  for (int64_t i = 0; i < z.size(0); ++i) hits += naive_argmax(z, i) == labels.data<int32_t>()[i] ? 1 : 0;
  return hits;
}

FANOUT_BACKEND_SUITE(SoftmaxXentOnBackend);
FANOUT_BACKEND_SUITE(CountCorrect);

// The double reference of one row set: mean loss, each row's loss and the
// gradient scale * (p - target), 0 on ignored rows.
struct XentRef {
  double loss = 0;
  std::vector<double> rows, grad;
};
XentRef reference(const Tensor& z, const Tensor& labels, double s, double scale) {
  const int64_t n = z.size(0), k = z.size(1);
  XentRef r;
  r.rows.assign(static_cast<size_t>(n), 0.0);
  r.grad.assign(static_cast<size_t>(n * k), 0.0);
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t y = labels.data<int32_t>()[i];
    if (y == kernels::kIgnoreLabel) continue;
    double m = -1e300, sum = 0, mean_logit = 0;
    for (int64_t j = 0; j < k; ++j) m = std::max(m, double(z.f32()[i * k + j]));
    for (int64_t j = 0; j < k; ++j) sum += std::exp(double(z.f32()[i * k + j]) - m), mean_logit += z.f32()[i * k + j];
    const double lse = std::log(sum) + m;
    r.rows[i] = (1 - s) * (lse - z.f32()[i * k + y]) + (s > 0 ? s * (lse - mean_logit / k) : 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const double p = std::exp(double(z.f32()[i * k + j]) - lse);
      r.grad[i * k + j] = scale * (p - s / k - (j == y ? 1 - s : 0.0));
    }
    r.loss += r.rows[i];
    ++counted;
  }
  r.loss /= static_cast<double>(counted);
  return r;
}

TEST_P(SoftmaxXentOnBackend, HandComputedValues) {
  Tensor z = Tensor::empty(Shape{1, 3}), labels = Tensor::empty(Shape{1}, DType::I32);
  z.f32()[0] = 1.0f;
  z.f32()[1] = 2.0f;
  z.f32()[2] = 3.0f;
  labels.data<int32_t>()[0] = 0;
  Tensor zd = up(z), yd = up(labels), loss = poisoned(Shape{1}), dz = poisoned(Shape{1, 3});
  Tensor correct = poisoned(Shape{1}, DType::I32);
  kernels::XentOutputs o;
  o.correct = &correct;
  o.dlogits = &dz;
  // lse = log(e + e^2 + e^3) = 3.40760596; -log p_0 = lse - 1; mean_k(-log p_k) = lse - 2.
  kernels::softmax_xent(ctx(), zd, yd, 0.0f, loss, o);
  EXPECT_NEAR(down(loss).f32()[0], 2.40760596, 1e-6);
  EXPECT_EQ(down(correct).data<int32_t>()[0], 0) << "the argmax is class 2";
  // p = (0.09003057, 0.24472847, 0.66524096); dlogits = p - onehot(0).
  Tensor d = down(dz);
  EXPECT_NEAR(d.f32()[0], 0.09003057 - 1.0, 1e-7);
  EXPECT_NEAR(d.f32()[1], 0.24472847, 1e-7);
  EXPECT_NEAR(d.f32()[2], 0.66524096, 1e-7);
  kernels::softmax_xent(ctx(), zd, yd, 0.1f, loss, o);
  EXPECT_NEAR(down(loss).f32()[0], 0.9 * 2.40760596 + 0.1 * 1.40760596, 1e-6);
  d = down(dz);
  EXPECT_NEAR(d.f32()[0], 0.09003057 - 0.9 - 0.1 / 3, 1e-7);
  EXPECT_NEAR(d.f32()[2], 0.66524096 - 0.1 / 3, 1e-7);
  labels.data<int32_t>()[0] = 2;
  Tensor y2 = up(labels);
  kernels::softmax_xent(ctx(), zd, y2, 0.0f, loss, o);
  EXPECT_NEAR(down(loss).f32()[0], 3.40760596 - 3.0, 1e-6);
  EXPECT_EQ(down(correct).data<int32_t>()[0], 1);
}

// Narrow rows (a warp a row on CUDA) and wide ones (a block a row): the
// loss, row losses, count and gradient of one call against float64; the
// same call without the gradient, and with it over the logits, agrees bit
// for bit.
TEST_P(SoftmaxXentOnBackend, EveryOutputAgainstFloat64) {
  std::mt19937_64 rng(81);
  for (float s : {0.0f, 0.1f, 0.3f, 1.0f})  // 1: torch's uniform targets
    for (auto [n, k] : {std::pair<int64_t, int>{7, 11}, {37, 10}, {3, 2}, {5, 1000}, {1029, 33}, {6, 1025},
                        {4, 5003}}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k << " smoothing " << s);
      Tensor z = ft::random_tensor(Shape{n, k}, rng, -4.0f, 4.0f), labels = ft::random_labels(n, k, rng);
      const float scale = 1.0f / static_cast<float>(n);
      Tensor zd = up(z), yd = up(labels);
      Tensor lossd = poisoned(Shape{1}), rowsd = poisoned(Shape{n}), cd = poisoned(Shape{1}, DType::I32);
      Tensor dzd = poisoned(Shape{n, k});
      kernels::XentOutputs o{&rowsd, &cd, &dzd, scale};
      kernels::softmax_xent(ctx(), zd, yd, s, lossd, o);
      const Tensor loss = down(lossd), rows = down(rowsd), dz = down(dzd);
      const XentRef ref = reference(z, labels, s, scale);
      EXPECT_NEAR(loss.f32()[0], ref.loss, 1e-5 * std::max(1.0, ref.loss));
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(rows.f32()[i], ref.rows[i], 1e-5 * std::max(1.0, ref.rows[i])) << i;
      EXPECT_EQ(down(cd).data<int32_t>()[0], naive_count_correct(z, labels));
      // n * dlogits against p - target: the gradient of the mean loss, at scale 1.
      for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(double(dz.f32()[i]) * n, ref.grad[i] * n, tol(1e-6, 1e-5)) << i;
      EXPECT_GT(ft::l2_norm(dz), 0.0);

      // Evaluation: no gradient, the same loss, rows and count.
      Tensor l2 = poisoned(Shape{1}), r2 = poisoned(Shape{n}), c2 = poisoned(Shape{1}, DType::I32);
      kernels::softmax_xent(ctx(), zd, yd, s, l2, kernels::XentOutputs{&r2, &c2});
      EXPECT_TRUE(ft::same_bits(down(l2), loss));
      EXPECT_TRUE(ft::same_bits(down(r2), rows));
      EXPECT_EQ(down(c2).data<int32_t>()[0], down(cd).data<int32_t>()[0]);
      // The gradient over the logits themselves.
      kernels::XentOutputs in_place{nullptr, nullptr, &zd, scale};
      kernels::softmax_xent(ctx(), zd, yd, s, l2, in_place);
      EXPECT_TRUE(ft::same_bits(down(zd), dz)) << "dlogits over logits";
      EXPECT_TRUE(ft::same_bits(down(l2), loss));

      if (n * k > 100) continue;  // central differences on the small case
      Tensor l3 = poisoned(Shape{1});
      auto f = [&] {
        Tensor ze = up(z);
        kernels::softmax_xent(ctx(), ze, yd, s, l3, kernels::XentOutputs{});
        return static_cast<double>(down(l3).f32()[0]);
      };
      auto res = ft::grad_check_detail(f, z, dz, 1e-2);
      EXPECT_LT(res.worst, 2e-2);
      EXPECT_EQ(res.checked, n * k);
    }
}

// Low-type logits (a linear layer's output under autocast) are read as they
// are and the gradient is stored in their type: the bits of the float32 call
// on the widened logits with the gradient rounded to that type, and within
// one rounding of the float64 reference. A float32 gradient rounded to the
// low type holds the same values.
TEST_P(SoftmaxXentOnBackend, LowTypeLogitsAndGradient) {
  std::mt19937_64 rng(84);
  for (DType t : {DType::BF16, DType::F16})
    for (auto [n, k] : {std::pair<int64_t, int>{33, 10}, {5, 3001}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " n " << n << " k " << k);
      const Tensor zl = ft::random_stored(Shape{n, k}, t, MemoryFormat::Contiguous, rng, -6.0f, 6.0f);
      Tensor labels = ft::random_labels(n, k, rng);
      labels.data<int32_t>()[1] = kernels::kIgnoreLabel;
      Tensor z = Tensor::empty(Shape{n, k});
      for (int64_t i = 0; i < z.numel(); ++i) z.f32()[i] = ft::stored(zl, i);
      const float scale = 1.0f / static_cast<float>(n);
      Tensor zd = up(zl), yd = up(labels), lossd = poisoned(Shape{1}), rowsd = poisoned(Shape{n});
      Tensor cd = poisoned(Shape{1}, DType::I32);
      Tensor dd = up(ft::poisoned_stored(Shape{n, k}, t, MemoryFormat::Contiguous));
      kernels::softmax_xent(ctx(), zd, yd, 0.1f, lossd, kernels::XentOutputs{&rowsd, &cd, &dd, scale, t});
      // The float32 call on the widened values, its gradient rounded to t.
      Tensor zf = up(z), lf = poisoned(Shape{1}), rf = poisoned(Shape{n}), cf = poisoned(Shape{1}, DType::I32);
      Tensor df = poisoned(Shape{n, k});
      kernels::softmax_xent(ctx(), zf, yd, 0.1f, lf, kernels::XentOutputs{&rf, &cf, &df, scale, t});
      const Tensor d = down(dd), dfl = down(df);
      EXPECT_TRUE(ft::same_bits(down(lossd), down(lf)));
      EXPECT_TRUE(ft::same_bits(down(rowsd), down(rf)));
      EXPECT_EQ(down(cd).data<int32_t>()[0], naive_count_correct(z, labels));
      const XentRef ref = reference(z, labels, 0.1, scale);
      const double u = ft::unit_roundoff(t);
      for (int64_t i = 0; i < n * k; ++i) {
        const float got = ft::stored(d, i);
        ASSERT_EQ(half::bits_of(got), half::bits_of(dfl.f32()[i])) << i << ": the rounded float32 gradient";
        // One rounding to t of a float32 value within float32's error of the reference.
        ASSERT_NEAR(got, ref.grad[i], u * std::abs(ref.grad[i]) + 1e-6 * scale) << i;
      }
      EXPECT_NEAR(down(lossd).f32()[0], ref.loss, 1e-5 * std::max(1.0, ref.loss));
      // Over the logits themselves, and without a gradient: the same bits.
      Tensor zi = up(zl), li = poisoned(Shape{1});
      kernels::softmax_xent(ctx(), zi, yd, 0.1f, li, kernels::XentOutputs{nullptr, nullptr, &zi, scale, t});
      EXPECT_TRUE(ft::same_bits(down(zi), d)) << "gradient over the logits";
      EXPECT_TRUE(ft::same_bits(down(li), down(lf)));
      Tensor ln = poisoned(Shape{1});
      kernels::softmax_xent(ctx(), zd, yd, 0.1f, ln, kernels::XentOutputs{});
      EXPECT_TRUE(ft::same_bits(down(ln), down(lf))) << "no gradient";
    }
}

TEST_P(SoftmaxXentOnBackend, StableForLargeLogits) {
  std::mt19937_64 rng(82);
  for (int k : {10, 2000}) {
    const int64_t n = 5;
    Tensor z = ft::random_tensor(Shape{n, k}, rng, -3.0f, 3.0f), labels = ft::random_labels(n, k, rng);
    for (int64_t i = 0; i < n * k; ++i) z.f32()[i] += (i % 2 ? 1000.0f : -1000.0f);
    Tensor zd = up(z), yd = up(labels), lossd = poisoned(Shape{1}), dd = poisoned(Shape{n, k});
    kernels::softmax_xent(ctx(), zd, yd, 0.1f, lossd, kernels::XentOutputs{nullptr, nullptr, &dd});
    const Tensor d = down(dd), loss = down(lossd);
    EXPECT_TRUE(std::isfinite(loss.f32()[0]));
    EXPECT_NEAR(loss.f32()[0], reference(z, labels, 0.1, 1.0).loss, 1e-3);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;  // sum_k (p_k - target_k) = 1 - 1
      for (int64_t j = 0; j < k; ++j) s += d.f32()[i * k + j];
      EXPECT_NEAR(s, 0.0, 1e-5);
    }
  }
}

// A logit of -inf (a masked class) has probability 0: without smoothing the
// loss is finite and its gradient there 0, as torch's; with smoothing the
// mean over classes is infinite, so is the loss (torch's too).
TEST_P(SoftmaxXentOnBackend, MinusInfinityLogitWithoutSmoothing) {
  std::mt19937_64 rng(85);
  for (int k : {7, 1200}) {
    SCOPED_TRACE(k);
    const int64_t n = 3;
    Tensor z = ft::random_tensor(Shape{n, k}, rng, -2.0f, 2.0f), labels = Tensor::empty(Shape{n}, DType::I32);
    for (int64_t i = 0; i < n; ++i) {
      labels.data<int32_t>()[i] = static_cast<int32_t>(i);
      z.f32()[i * k + k - 1] = -std::numeric_limits<float>::infinity();
    }
    Tensor zd = up(z), yd = up(labels), lossd = poisoned(Shape{1}), dd = poisoned(Shape{n, k});
    kernels::softmax_xent(ctx(), zd, yd, 0.0f, lossd, kernels::XentOutputs{nullptr, nullptr, &dd, 1.0f});
    const XentRef ref = reference(z, labels, 0.0, 1.0);  // exp(-inf) = 0 there
    EXPECT_NEAR(down(lossd).f32()[0], ref.loss, 1e-5 * std::max(1.0, ref.loss));
    const Tensor d = down(dd);
    for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(d.f32()[i], ref.grad[i], 1e-6) << i;
    kernels::softmax_xent(ctx(), zd, yd, 0.1f, lossd, kernels::XentOutputs{});
    EXPECT_TRUE(std::isinf(down(lossd).f32()[0]));
  }
}

TEST_P(SoftmaxXentOnBackend, LabelOutOfRangeGivesNanLossOnCuda) {
  if (!on_cuda()) GTEST_SKIP() << "the CPU throws instead (SoftmaxXent.LabelOutOfRangeThrowsOneLine)";
  std::mt19937_64 rng(20);
  const int64_t n = 9;
  for (int k : {10, 1500}) {
    Tensor labels = ft::random_labels(n, k, rng);
    for (int32_t bad : {-2, k, 1000000}) {  // -1 is the ignored label
      SCOPED_TRACE(::testing::Message() << "k " << k << " label " << bad);
      labels.data<int32_t>()[4] = bad;
      Tensor zd = up(ft::random_tensor(Shape{n, k}, rng)), yd = up(labels);
      Tensor lossd = up(Tensor::zeros(Shape{1})), dld = up(Tensor::zeros(Shape{n, k}));
      kernels::softmax_xent(ctx(), zd, yd, 0.0f, lossd, kernels::XentOutputs{nullptr, nullptr, &dld, 1.0f});
      EXPECT_TRUE(std::isnan(down(lossd).f32()[0]));
      const Tensor dl = down(dld);
      EXPECT_TRUE(std::isnan(dl.f32()[4 * k])) << "the bad row's gradient is NaN";
      EXPECT_FALSE(std::isnan(dl.f32()[0])) << "other rows are finite";
    }
  }
}

// Label -1 (kernels::kIgnoreLabel, torch's ignore_index as nanoGPT sets it):
// the row's loss and gradient are 0 and the mean is over the other rows
// (NaN when every row is ignored, as torch's).
TEST_P(SoftmaxXentOnBackend, IgnoredRowsHaveNoLossOrGradient) {
  std::mt19937_64 rng(24);
  for (int k : {9, 1100}) {
    SCOPED_TRACE(k);
    const int64_t n = 7;
    Tensor z = ft::random_tensor(Shape{n, k}, rng, -3.0f, 3.0f), labels = ft::random_labels(n, k, rng);
    for (int64_t i : {1, 4, 5}) labels.data<int32_t>()[i] = kernels::kIgnoreLabel;
    Tensor zd = up(z), yd = up(labels), lossd = poisoned(Shape{1}), rows = poisoned(Shape{n});
    Tensor dld = poisoned(Shape{n, k});
    kernels::softmax_xent(ctx(), zd, yd, 0.1f, lossd, kernels::XentOutputs{&rows, nullptr, &dld, 0.5f});
    const Tensor rl = down(rows), dl = down(dld);
    const XentRef ref = reference(z, labels, 0.1, 0.5);
    for (int64_t i = 0; i < n; ++i) {
      if (labels.data<int32_t>()[i] == kernels::kIgnoreLabel) {
        EXPECT_EQ(rl.f32()[i], 0.0f) << "row " << i;
        for (int64_t j = 0; j < k; ++j) ASSERT_EQ(dl.f32()[i * k + j], 0.0f) << "row " << i;
        continue;
      }
      EXPECT_NEAR(rl.f32()[i], ref.rows[i], 1e-5 * std::abs(ref.rows[i])) << "row " << i;
      for (int64_t j = 0; j < k; ++j) ASSERT_NEAR(dl.f32()[i * k + j], ref.grad[i * k + j], 1e-6) << i << " " << j;
    }
    EXPECT_NEAR(down(lossd).f32()[0], ref.loss, 1e-5 * ref.loss);
    for (int64_t i = 0; i < n; ++i) labels.data<int32_t>()[i] = kernels::kIgnoreLabel;
    Tensor all = up(labels);
    kernels::softmax_xent(ctx(), zd, all, 0.0f, lossd, kernels::XentOutputs{});
    EXPECT_TRUE(std::isnan(down(lossd).f32()[0])) << "the mean of no rows";
  }
}

TEST_P(CountCorrect, FirstMaximumWins) {
  Tensor z = Tensor::zeros(Shape{4, 3}), labels = Tensor::empty(Shape{4}, DType::I32);
  // Row 0: max at 2. Row 1: tie between 0 and 1 -> 0. Row 2: all equal -> 0. Row 3: max at 1.
  const float v[12] = {0, 1, 2, 5, 5, 1, 3, 3, 3, -1, 4, 2};
  std::copy(v, v + 12, z.f32());
  const int32_t y[4] = {2, 1, 0, 1};  // correct, wrong (tie goes to 0), correct, correct
  std::copy(y, y + 4, labels.data<int32_t>());
  Tensor zd = up(z), yd = up(labels), loss = poisoned(Shape{1}), correct = poisoned(Shape{1}, DType::I32);
  kernels::XentOutputs o;
  o.correct = &correct;
  kernels::softmax_xent(ctx(), zd, yd, 0.0f, loss, o);
  EXPECT_EQ(down(correct).data<int32_t>()[0], 3);
}

TEST_P(CountCorrect, TiesAndNanAgainstNaive) {
  for (int k : {1, 3, 10, 77, 1300}) {
    SCOPED_TRACE(k);
    std::mt19937_64 rng(30 + static_cast<uint64_t>(k));
    const int64_t n = k > 1024 ? 67 : 1031;
    Tensor logits = ft::random_tensor(Shape{n, k}, rng);
    // Few distinct values: many ties (first maximum wins); some NaN rows.
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = std::round(logits.f32()[i] * 1.5f);
    for (int64_t r = 0; r < n; r += 17) logits.f32()[r * k + (r % k)] = std::numeric_limits<float>::quiet_NaN();
    // Infinities (no NaN in most of these rows): +inf is the maximum, -inf never is unless all are.
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t r = 5; r < n; r += 19) {
      logits.f32()[r * k + (r * 3) % k] = -inf;
      if (r % 2) logits.f32()[r * k + (r * 7) % k] = inf;
    }
    if (n > 2)
      for (int64_t j = 0; j < k; ++j) logits.f32()[2 * k + j] = -inf;  // a row of -inf: the first wins
    Tensor labels = ft::random_labels(n, k, rng);
    for (int64_t r = 0; r < n; r += 3) labels.data<int32_t>()[r] = static_cast<int32_t>(naive_argmax(logits, r));
    Tensor zd = up(logits), yd = up(labels), loss = poisoned(Shape{1}), cd = poisoned(Shape{1}, DType::I32);
    kernels::XentOutputs o;
    o.correct = &cd;
    kernels::softmax_xent(ctx(), zd, yd, 0.0f, loss, o);
    const int32_t want = naive_count_correct(logits, labels);
    EXPECT_EQ(down(cd).data<int32_t>()[0], want);
    EXPECT_GE(want, (n + 2) / 3);
  }
}

TEST(SoftmaxXent, LabelOutOfRangeThrowsOneLine) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(83);
  Tensor z = ft::random_tensor(Shape{3, 5}, rng), labels = ft::random_labels(3, 5, rng);
  Tensor loss = Tensor::empty(Shape{1}), d = Tensor::empty(Shape{3, 5});
  for (int32_t bad : {5, -2, 1000}) {  // -1 is the ignored label
    labels.data<int32_t>()[1] = bad;
    for (Tensor* dl : {static_cast<Tensor*>(nullptr), &d}) {
      try {
        kernels::softmax_xent(ctx, z, labels, 0.0f, loss, kernels::XentOutputs{nullptr, nullptr, dl});
        FAIL() << "label " << bad << " accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
        EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      }
    }
  }
}

TEST(SoftmaxXent, BadLabelLeavesLogitsUntouchedInPlace) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(86);
  Tensor z = ft::random_tensor(Shape{4, 6}, rng), labels = ft::random_labels(4, 6, rng);
  labels.data<int32_t>()[3] = 6;
  const Tensor before = ft::clone(z);
  Tensor loss = Tensor::empty(Shape{1});
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels, 0.0f, loss, kernels::XentOutputs{nullptr, nullptr, &z}), Error);
  EXPECT_TRUE(ft::same_bits(z, before)) << "the error comes before any row is written";
}

TEST_P(SoftmaxXentOnBackend, ShapeErrorsThrow) {
  Context& ctx = this->ctx();
  Tensor z = up(Tensor::zeros(Shape{3, 5})), labels = up(Tensor::zeros(Shape{4}, DType::I32));
  Tensor loss = up(Tensor::empty(Shape{1}));
  const kernels::XentOutputs none;
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels, 0.0f, loss, none), Error);
  Tensor labels3 = up(Tensor::zeros(Shape{3}, DType::I32)), labels_f = up(Tensor::zeros(Shape{3}));
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels_f, 0.0f, loss, none), Error);
  Tensor z_int = up(Tensor::zeros(Shape{3, 5}, DType::I32));
  EXPECT_THROW(kernels::softmax_xent(ctx, z_int, labels3, 0.0f, loss, none), Error);
  Tensor bad = up(Tensor::empty(Shape{3, 4}));
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels3, 0.0f, loss, kernels::XentOutputs{nullptr, nullptr, &bad}),
               Error);
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels3, 0.0f, loss, kernels::XentOutputs{&bad}), Error);
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels3, 1.5f, loss, none), Error);
  Tensor correct_f = up(Tensor::empty(Shape{1}));
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels3, 0.0f, loss, kernels::XentOutputs{nullptr, &correct_f}), Error);
  Tensor d = up(Tensor::empty(Shape{3, 5}));
  kernels::XentOutputs f64{nullptr, nullptr, &d};
  f64.round = DType::F64;
  EXPECT_THROW(kernels::softmax_xent(ctx, z, labels3, 0.0f, loss, f64), Error);
  // Low-type logits, the gradient over them.
  Tensor zb = up(Tensor::zeros(Shape{3, 5}, DType::BF16));
  Tensor alias = zb.view(Shape{3, 5});
  EXPECT_NO_THROW(kernels::softmax_xent(ctx, zb, labels3, 0.0f, loss, kernels::XentOutputs{nullptr, nullptr, &alias}));
  EXPECT_NO_THROW(kernels::softmax_xent(ctx, z, labels3, 0.0f, loss, kernels::XentOutputs{nullptr, nullptr, &d}));
}

}  // namespace
}  // namespace fanout
