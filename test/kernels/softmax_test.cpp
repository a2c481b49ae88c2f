// Softmax over the last dim on every backend against float64 references:
// forward (odd row lengths, one to four dims, 1e4 logit offsets, -inf
// entries and rows that are all -inf, the causal mask for T in {1, 7, 64}
// with the masked entries never read), backward against y * (dy - sum(dy y))
// in float64 and against central differences of the float64 softmax, y
// written over x and dx over dy, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/softmax.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

constexpr double kInf = std::numeric_limits<double>::infinity();

// torch.softmax(x, -1) in float64 over rows of n = x's last size; causal:
// row r sees keys 0..r mod n. A row with nothing but -inf is zeros.
std::vector<double> softmax_reference(const std::vector<double>& x, int64_t n, bool causal) {
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < static_cast<int64_t>(x.size()) / n; ++r) {
    const int64_t visible = causal ? r % n + 1 : n;
    const double* xr = x.data() + r * n;
    double m = -kInf, sum = 0;
    for (int64_t j = 0; j < visible; ++j) m = std::max(m, xr[j]);
    if (m == -kInf) continue;
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(xr[j] - m);
    for (int64_t j = 0; j < visible; ++j) y[static_cast<size_t>(r * n + j)] = std::exp(xr[j] - m) / sum;
  }
  return y;
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.f32()[i];
  return v;
}

// Every element within rtol of want, relative to bound[i] (|want| when no
// bound is given); an exact zero wanted is an exact zero got; no NaN.
::testing::AssertionResult close_elementwise(const Tensor& got, const std::vector<double>& want, double rtol,
                                             const std::vector<double>* bound = nullptr) {
  if (got.numel() != static_cast<int64_t>(want.size()))
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.size();
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got.f32()[i], w = want[i], b = bound ? (*bound)[i] : std::abs(w);
    const bool ok = w == 0.0 && b == 0.0 ? g == 0.0 : std::abs(g - w) <= rtol * b;
    if (!ok)
      return ::testing::AssertionFailure() << "element " << i << ": " << g << " vs " << w << " (bound " << b << ")";
  }
  return ::testing::AssertionSuccess();
}

// A causal input's masked entries (j > r mod n) set to `v`: never to be read.
void fill_masked(Tensor& x, float v) {
  const int64_t n = x.size(-1);
  for (int64_t r = 0; r < x.numel() / n; ++r)
    for (int64_t j = r % n + 1; j < n; ++j) x.f32()[r * n + j] = v;
}

FANOUT_BACKEND_SUITE(SoftmaxOnBackend);

TEST_P(SoftmaxOnBackend, ForwardAgainstFloat64) {
  struct Case {
    Shape x;
    bool causal;
    float scale;  // inputs uniform in [-scale, scale)
  };
  const Case cases[] = {{Shape{3, 37}, false, 4.0f},       {Shape{2, 1000}, false, 4.0f},
                        {Shape{5}, false, 3.0f},           {Shape{2, 3, 4, 33}, false, 2.0f},
                        {Shape{4, 1, 1}, true, 3.0f},      {Shape{2, 3, 7, 7}, true, 4.0f},
                        {Shape{2, 64, 64}, true, 4.0f},    {Shape{3, 257}, false, 0.01f}};
  std::mt19937_64 rng(101);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.x.str() + (cs.causal ? " causal" : ""));
    Tensor x = ft::random_tensor(cs.x, rng, -cs.scale, cs.scale);
    if (cs.causal) fill_masked(x, 1e30f);  // what a read of a masked entry would show
    const int64_t n = cs.x[-1];
    const std::vector<double> want = softmax_reference(values(x), n, cs.causal);
    Tensor xd = up(x), yd = poisoned(cs.x);
    kernels::softmax_forward(ctx(), xd, cs.causal, yd);
    const Tensor y = down(yd);
    EXPECT_TRUE(close_elementwise(y, want, 1e-5));
    EXPECT_GT(ft::l2_norm(y), 0.0);
    for (int64_t r = 0; r < x.numel() / n; ++r) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += y.f32()[r * n + j];
      EXPECT_NEAR(s, 1.0, 1e-5) << "row " << r;
    }
    // y written over x: the same bits.
    Tensor inplace = up(x);
    kernels::softmax_forward(ctx(), inplace, cs.causal, inplace);
    EXPECT_TRUE(ft::same_bits(down(inplace), y)) << "y over x";
  }
}

// Logits offset by +-1e4 (exp would overflow without the max), -inf
// entries, and rows of nothing but -inf: zeros, never NaN.
TEST_P(SoftmaxOnBackend, LargeLogitsAndInfinities) {
  const int64_t rows = 6, n = 45;
  std::mt19937_64 rng(102);
  Tensor x = ft::random_tensor(Shape{rows, n}, rng, -4.0f, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    x.f32()[0 * n + j] += 1e4f;                      // all near 1e4
    x.f32()[1 * n + j] -= 1e4f;                      // all near -1e4
    x.f32()[2 * n + j] += j % 2 ? 1e4f : -1e4f;      // two clusters: one is exactly 0
    x.f32()[3 * n + j] = -inf;                       // fully masked
    if (j % 3 == 0) x.f32()[4 * n + j] = -inf;       // partly masked
  }
  x.f32()[5 * n + 7] = 3e4f;  // one entry takes everything
  const std::vector<double> want = softmax_reference(values(x), n, false);
  Tensor xd = up(x), yd = poisoned(x.shape());
  kernels::softmax_forward(ctx(), xd, false, yd);
  const Tensor y = down(yd);
  EXPECT_TRUE(close_elementwise(y, want, 1e-5));
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(y.f32()[3 * n + j], 0.0f) << "fully masked row, column " << j;
    if (j % 3 == 0) EXPECT_EQ(y.f32()[4 * n + j], 0.0f) << "-inf entry, column " << j;
    if (j % 2 == 0) EXPECT_EQ(y.f32()[2 * n + j], 0.0f) << "the low cluster, column " << j;
  }
  EXPECT_EQ(y.f32()[5 * n + 7], 1.0f);
  // Backward through the zero rows stays zero.
  Tensor dy = ft::random_tensor(x.shape(), rng), dyd = up(dy), dxd = poisoned(x.shape());
  kernels::softmax_backward(ctx(), yd, dyd, dxd);
  const Tensor dx = down(dxd);
  for (int64_t j = 0; j < n; ++j) EXPECT_EQ(dx.f32()[3 * n + j], 0.0f) << "column " << j;
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_FALSE(std::isnan(dx.f32()[i])) << "element " << i;
}

// A causal row whose visible keys are all -inf (query 0 with x[0] = -inf)
// is zeros; the rows after it are not.
TEST_P(SoftmaxOnBackend, FullyMaskedCausalRowIsZeros) {
  const int64_t t = 7;
  std::mt19937_64 rng(103);
  Tensor x = ft::random_tensor(Shape{2, t, t}, rng, -3.0f, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  x.f32()[0] = -inf;          // sample 0, query 0: its one key
  x.f32()[t * t + 0] = -inf;  // sample 1, query 0
  for (int64_t j = 0; j < t; ++j) x.f32()[t * t + 3 * t + j] = -inf;  // sample 1, query 3: every key
  const std::vector<double> want = softmax_reference(values(x), t, true);
  Tensor xd = up(x), yd = poisoned(x.shape());
  kernels::softmax_forward(ctx(), xd, true, yd);
  const Tensor y = down(yd);
  EXPECT_TRUE(close_elementwise(y, want, 1e-5));
  for (int64_t j = 0; j < t; ++j) {
    EXPECT_EQ(y.f32()[j], 0.0f);
    EXPECT_EQ(y.f32()[t * t + j], 0.0f);
    EXPECT_EQ(y.f32()[t * t + 3 * t + j], 0.0f);
  }
  EXPECT_GT(y.f32()[t], 0.0f);  // query 1 still sees key 1
}

TEST_P(SoftmaxOnBackend, BackwardAgainstFormulaAndCentralDifferences) {
  struct Case {
    Shape x;
    bool causal;
  };
  const Case cases[] = {{Shape{3, 37}, false}, {Shape{2, 513}, false}, {Shape{1, 1, 1}, true},
                        {Shape{2, 7, 7}, true}, {Shape{64, 64}, true},  {Shape{9}, false}};
  std::mt19937_64 rng(104);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.x.str() + (cs.causal ? " causal" : ""));
    const int64_t n = cs.x[-1];
    Tensor x = ft::random_tensor(cs.x, rng, -3.0f, 3.0f), dy = ft::random_tensor(cs.x, rng);
    Tensor xd = up(x), yd = poisoned(cs.x), dyd = up(dy), dxd = poisoned(cs.x);
    kernels::softmax_forward(ctx(), xd, cs.causal, yd);
    kernels::softmax_backward(ctx(), yd, dyd, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    // The formula in float64 from the op's y; the bound is the size of the
    // terms it subtracts, y * (|dy| + |sum|).
    std::vector<double> want(static_cast<size_t>(x.numel())), bound(want.size());
    for (int64_t r = 0; r < x.numel() / n; ++r) {
      double dot = 0, mag = 0;
      for (int64_t j = 0; j < n; ++j) {
        dot += double(dy.f32()[r * n + j]) * y.f32()[r * n + j];
        mag += std::abs(double(dy.f32()[r * n + j]) * y.f32()[r * n + j]);
      }
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = static_cast<size_t>(r * n + j);
        want[i] = y.f32()[i] * (dy.f32()[i] - dot);
        bound[i] = std::abs(double(y.f32()[i])) * (std::abs(double(dy.f32()[i])) + mag);
      }
    }
    EXPECT_TRUE(close_elementwise(dx, want, 1e-5, &bound));
    if (n > 1) EXPECT_GT(ft::l2_norm(dx), 0.0);
    // Central differences of L = sum(dy * softmax(x)) in float64.
    const std::vector<double> x64 = values(x), dy64 = values(dy);
    auto loss = [&](const std::vector<double>& xv) {
      const std::vector<double> yv = softmax_reference(xv, n, cs.causal);
      double l = 0;
      for (size_t i = 0; i < yv.size(); ++i) l += dy64[i] * yv[i];
      return l;
    };
    double peak = 0;
    for (int64_t i = 0; i < dx.numel(); ++i) peak = std::max(peak, std::abs(double(dx.f32()[i])));
    const double h = 1e-5;
    for (int64_t i = 0; i < x.numel(); i += std::max<int64_t>(1, x.numel() / 300)) {
      std::vector<double> xp = x64, xm = x64;
      xp[static_cast<size_t>(i)] += h;
      xm[static_cast<size_t>(i)] -= h;
      const double fd = (loss(xp) - loss(xm)) / (2 * h);
      EXPECT_NEAR(dx.f32()[i], fd, 1e-5 * std::max(peak, 1e-3)) << "element " << i;
    }
    // dx written over dy: the same bits.
    Tensor inplace = up(dy);
    kernels::softmax_backward(ctx(), yd, inplace, inplace);
    EXPECT_TRUE(ft::same_bits(down(inplace), dx)) << "dx over dy";
  }
}

TEST_P(SoftmaxOnBackend, RefusesBadArguments) {
  Tensor x = up(Tensor::zeros(Shape{3, 4})), y = up(Tensor::zeros(Shape{3, 4})), y5 = up(Tensor::zeros(Shape{3, 5}));
  EXPECT_THROW(kernels::softmax_forward(ctx(), x, true, y), Error);  // causal but not (..., T, T)
  EXPECT_THROW(kernels::softmax_forward(ctx(), x, false, y5), Error);
  Tensor x1 = up(Tensor::zeros(Shape{4}));
  EXPECT_THROW(kernels::softmax_forward(ctx(), x1, true, x1), Error);  // causal needs two dims
  Tensor xi = up(Tensor::zeros(Shape{3, 4}, DType::I32));
  EXPECT_THROW(kernels::softmax_forward(ctx(), xi, false, y), Error);
  EXPECT_THROW(kernels::softmax_backward(ctx(), y, y5, y), Error);
  EXPECT_THROW(kernels::softmax_backward(ctx(), y, y, y5), Error);
}

}  // namespace
}  // namespace fanout
