// Softmax cross-entropy (PyTorch's CrossEntropyLoss with label smoothing,
// reduction = mean) against a double reference and hand-computed values;
// numerical stability; central-difference gradients with and without
// smoothing; accuracy counting; label range and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/loss.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

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

TEST(SoftmaxXent, HandComputedValues) {
  Context ctx(Device::cpu());
  Tensor z = Tensor::empty(Shape{1, 3}), labels = Tensor::empty(Shape{1}, DType::I32);
  z.f32()[0] = 1.0f;
  z.f32()[1] = 2.0f;
  z.f32()[2] = 3.0f;
  labels.data<int32_t>()[0] = 0;
  Tensor probs = Tensor::empty(Shape{1, 3}), loss = Tensor::empty(Shape{1});
  // lse = log(e + e^2 + e^3) = 3.40760596; -log p_0 = lse - 1; mean_k(-log p_k) = lse - 2.
  kernels::softmax_xent_forward(ctx, z, labels, 0.0f, probs, loss);
  EXPECT_NEAR(loss.f32()[0], 2.40760596, 1e-6);
  kernels::softmax_xent_forward(ctx, z, labels, 0.1f, probs, loss);
  EXPECT_NEAR(loss.f32()[0], 0.9 * 2.40760596 + 0.1 * 1.40760596, 1e-6);
  EXPECT_NEAR(probs.f32()[0], 0.09003057, 1e-7);
  EXPECT_NEAR(probs.f32()[2], 0.66524096, 1e-7);
}

TEST(SoftmaxXent, ForwardBackwardAgainstNaive) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(81);
  for (float s : {0.0f, 0.1f, 0.3f}) {
    const int64_t n = 7, k = 11;
    Tensor z = ft::random_tensor(Shape{n, k}, rng, -4.0f, 4.0f), labels = ft::random_labels(n, k, rng);
    Tensor probs = Tensor::empty(Shape{n, k}), loss = Tensor::empty(Shape{1}), dz = Tensor::empty(Shape{n, k});
    ft::poison(probs);
    ft::poison(loss);
    ft::poison(dz);
    kernels::softmax_xent_forward(ctx, z, labels, s, probs, loss);
    std::vector<double> rp;
    const double ref = naive_xent(z, labels, s, &rp);
    EXPECT_NEAR(loss.f32()[0], ref, 1e-5 * std::max(1.0, ref)) << s;
    for (int64_t i = 0; i < n * k; ++i) ASSERT_NEAR(probs.f32()[i], rp[i], 1e-6) << s;
    const float scale = 1.0f / n;
    kernels::softmax_xent_backward(ctx, probs, labels, s, scale, dz);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const double target = (1 - s) * (labels.data<int32_t>()[i] == j ? 1.0 : 0.0) + s / k;
        ASSERT_NEAR(dz.f32()[i * k + j], (rp[i * k + j] - target) / n, 1e-6) << s;
      }
    EXPECT_GT(ft::l2_norm(dz), 0.0);

    // dlogits with scale = 1 / N is the gradient of the mean loss.
    Tensor p2 = Tensor::empty(Shape{n, k}), l2 = Tensor::empty(Shape{1});
    auto f = [&] {
      kernels::softmax_xent_forward(ctx, z, labels, s, p2, l2);
      return static_cast<double>(l2.f32()[0]);
    };
    auto res = ft::grad_check_detail(f, z, dz, 1e-2);
    EXPECT_LT(res.worst, 2e-2) << s;
    EXPECT_EQ(res.checked, n * k) << s;

    // dlogits may alias probs.
    Tensor pa = ft::clone(probs);
    kernels::softmax_xent_backward(ctx, pa, labels, s, scale, pa);
    for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(pa.f32()[i], dz.f32()[i]);
  }
}

TEST(SoftmaxXent, StableForLargeLogits) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(82);
  const int64_t n = 5, k = 10;
  Tensor z = ft::random_tensor(Shape{n, k}, rng, -3.0f, 3.0f), labels = ft::random_labels(n, k, rng);
  for (int64_t i = 0; i < n * k; ++i) z.f32()[i] += (i % 2 ? 1000.0f : -1000.0f);
  Tensor probs = Tensor::empty(Shape{n, k}), loss = Tensor::empty(Shape{1});
  kernels::softmax_xent_forward(ctx, z, labels, 0.1f, probs, loss);
  EXPECT_TRUE(std::isfinite(loss.f32()[0]));
  EXPECT_NEAR(loss.f32()[0], naive_xent(z, labels, 0.1), 1e-3);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += probs.f32()[i * k + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(CountCorrect, FirstMaximumWins) {
  Context ctx(Device::cpu());
  Tensor z = Tensor::zeros(Shape{4, 3}), labels = Tensor::empty(Shape{4}, DType::I32);
  Tensor correct = Tensor::empty(Shape{1}, DType::I32);
  // Row 0: max at 2. Row 1: tie between 0 and 1 -> 0. Row 2: all equal -> 0. Row 3: max at 1.
  const float v[12] = {0, 1, 2, 5, 5, 1, 3, 3, 3, -1, 4, 2};
  std::copy(v, v + 12, z.f32());
  const int32_t y[4] = {2, 1, 0, 1};  // correct, wrong (tie goes to 0), correct, correct
  std::copy(y, y + 4, labels.data<int32_t>());
  kernels::count_correct(ctx, z, labels, correct);
  EXPECT_EQ(correct.data<int32_t>()[0], 3);
}

TEST(SoftmaxXent, LabelOutOfRangeThrowsOneLine) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(83);
  Tensor z = ft::random_tensor(Shape{3, 5}, rng), labels = ft::random_labels(3, 5, rng);
  Tensor probs = Tensor::empty(Shape{3, 5}), loss = Tensor::empty(Shape{1});
  for (int32_t bad : {5, -1, 1000}) {
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

TEST(SoftmaxXent, ShapeErrorsThrow) {
  Context ctx(Device::cpu());
  Tensor z = Tensor::zeros(Shape{3, 5}), labels = Tensor::zeros(Shape{4}, DType::I32);
  Tensor probs = Tensor::empty(Shape{3, 5}), loss = Tensor::empty(Shape{1});
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels, 0.0f, probs, loss), Error);
  Tensor labels3 = Tensor::zeros(Shape{3}, DType::I32), labels_f = Tensor::zeros(Shape{3});
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels_f, 0.0f, probs, loss), Error);
  Tensor probs_bad = Tensor::empty(Shape{3, 4});
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 0.0f, probs_bad, loss), Error);
  EXPECT_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 1.5f, probs, loss), Error);
  Tensor correct_f = Tensor::empty(Shape{1});
  EXPECT_THROW(kernels::count_correct(ctx, z, labels3, correct_f), Error);
  EXPECT_NO_THROW(kernels::softmax_xent_forward(ctx, z, labels3, 0.0f, probs, loss));
}

}  // namespace
}  // namespace fanout
