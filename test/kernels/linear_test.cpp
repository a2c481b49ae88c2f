// Fully connected layer: forward against a naive double reference; backward
// against the double reference and central differences; += semantics.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/linear.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct LinearRef {
  std::vector<double> y, dx, dw, db;
};

// y = x W^T + b; with dy: dx = dy W, dw = dy^T x, db = sum_n dy.
LinearRef naive_linear(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& dy) {
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  const float *xp = x.f32(), *wp = w.f32(), *gp = dy.f32();
  LinearRef r{std::vector<double>(n * out), std::vector<double>(n * in), std::vector<double>(out * in),
              std::vector<double>(out)};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? b->f32()[o] : 0.0;
      for (int64_t j = 0; j < in; ++j) s += double(xp[i * in + j]) * wp[o * in + j];
      r.y[i * out + o] = s;
      const double g = gp[i * out + o];
      r.db[o] += g;
      for (int64_t j = 0; j < in; ++j) {
        r.dx[i * in + j] += g * wp[o * in + j];
        r.dw[o * in + j] += g * xp[i * in + j];
      }
    }
  return r;
}

void expect_close(const Tensor& t, const std::vector<double>& ref, double tol, const char* what) {
  ASSERT_EQ(static_cast<size_t>(t.numel()), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(t.f32()[i], ref[i], tol) << what << " at " << i;
}

TEST(Linear, ForwardBackwardAgainstNaive) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(31);
  for (bool with_bias : {true, false}) {
    const int64_t n = 3, in = 7, out = 5;
    Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
    Tensor b = ft::random_tensor(Shape{out}, rng), dy = ft::random_tensor(Shape{n, out}, rng);
    Tensor y = Tensor::empty(Shape{n, out}), dx = Tensor::empty(Shape{n, in});
    ft::poison(y);
    ft::poison(dx);
    Tensor dw0 = ft::random_tensor(Shape{out, in}, rng), db0 = ft::random_tensor(Shape{out}, rng);
    Tensor dw = ft::clone(dw0), db = ft::clone(db0);
    const Tensor* bp = with_bias ? &b : nullptr;
    kernels::linear_forward(ctx, x, w, bp, y);
    kernels::linear_backward(ctx, x, w, dy, &dx, dw, with_bias ? &db : nullptr);
    LinearRef r = naive_linear(x, w, bp, dy);
    expect_close(y, r.y, 1e-5, "y");
    expect_close(dx, r.dx, 1e-5, "dx");
    for (int64_t i = 0; i < dw.numel(); ++i) r.dw[i] += dw0.f32()[i];  // += onto the initial gradient
    expect_close(dw, r.dw, 1e-5, "dw");
    if (with_bias) {
      for (int64_t i = 0; i < db.numel(); ++i) r.db[i] += db0.f32()[i];
      expect_close(db, r.db, 1e-5, "db");
    } else {
      for (int64_t i = 0; i < db.numel(); ++i) EXPECT_EQ(db.f32()[i], db0.f32()[i]);
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST(Linear, GradientsByCentralDifferences) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(32);
  const int64_t n = 3, in = 9, out = 5;
  Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
  Tensor b = ft::random_tensor(Shape{out}, rng), r = ft::random_tensor(Shape{n, out}, rng);
  Tensor y = Tensor::empty(Shape{n, out});
  auto loss = [&] {
    kernels::linear_forward(ctx, x, w, &b, y);
    return ft::dot(y, r);
  };
  Tensor dx = Tensor::empty(Shape{n, in}), dw = Tensor::zeros(Shape{out, in}), db = Tensor::zeros(Shape{out});
  ft::poison(dx);
  kernels::linear_backward(ctx, x, w, r, &dx, dw, &db);
  for (auto [t, g, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
    auto res = ft::grad_check_detail(loss, *t, *g);
    EXPECT_LT(res.worst, 1e-2) << name;
    EXPECT_EQ(res.checked, static_cast<int>(t->numel())) << name;
    EXPECT_GT(ft::l2_norm(*g), 0.0) << name;
  }
}

TEST(Linear, BackwardAccumulatesParameterGradients) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(33);
  Tensor x = ft::random_tensor(Shape{4, 6}, rng), w = ft::random_tensor(Shape{3, 6}, rng);
  Tensor dy = ft::random_tensor(Shape{4, 3}, rng);
  Tensor dw = Tensor::zeros(Shape{3, 6}), db = Tensor::zeros(Shape{3});
  kernels::linear_backward(ctx, x, w, dy, nullptr, dw, &db);
  Tensor dw1 = ft::clone(dw), db1 = ft::clone(db);
  Tensor dx = Tensor::empty(Shape{4, 6});
  kernels::linear_backward(ctx, x, w, dy, &dx, dw, &db);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.f32()[i], 2 * dw1.f32()[i], 1e-6);
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_NEAR(db.f32()[i], 2 * db1.f32()[i], 1e-6);
  EXPECT_GT(ft::l2_norm(dw1), 0.0);
}

// Split-invariant math: the same values as the naive reference, and every
// row's output, every dx row and the float64 dw/db sums come out bit for bit
// the same whether the batch is processed whole or in parts, in any order.
TEST(Linear, SplitInvariantRowsAndExactGradientSums) {
  Context ctx(Device::cpu());
  ctx.math.split_invariant = true;
  std::mt19937_64 rng(34);
  const int64_t n = 13, in = 37, out = 11, cut = 5;  // in is not a multiple of the 8 partial sums
  Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
  Tensor b = ft::random_tensor(Shape{out}, rng), dy = ft::random_tensor(Shape{n, out}, rng);
  Tensor y = Tensor::empty(Shape{n, out}), dx = Tensor::empty(Shape{n, in});
  ft::poison(y);
  ft::poison(dx);
  Tensor dw = Tensor::zeros(Shape{out, in}, DType::F64), db = Tensor::zeros(Shape{out}, DType::F64);
  kernels::linear_forward(ctx, x, w, &b, y);
  kernels::linear_backward(ctx, x, w, dy, &dx, dw, &db);
  LinearRef r = naive_linear(x, w, &b, dy);
  expect_close(y, r.y, 1e-5, "y");
  expect_close(dx, r.dx, 1e-5, "dx");
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.f64()[i], r.dw[i], 1e-6) << "dw at " << i;
  for (int64_t i = 0; i < db.numel(); ++i) ASSERT_NEAR(db.f64()[i], r.db[i], 1e-12) << "db at " << i;

  // The same batch in two parts, the second part first, into fresh gradients.
  Tensor y2 = Tensor::empty(Shape{n, out}), dx2 = Tensor::empty(Shape{n, in});
  Tensor dw2 = Tensor::zeros(Shape{out, in}, DType::F64), db2 = Tensor::zeros(Shape{out}, DType::F64);
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{cut, n}, {0, cut}}) {
    Tensor ys = y2.slice(lo, hi), dxs = dx2.slice(lo, hi);
    kernels::linear_forward(ctx, x.slice(lo, hi), w, &b, ys);
    kernels::linear_backward(ctx, x.slice(lo, hi), w, dy.slice(lo, hi), &dxs, dw2, &db2);
  }
  EXPECT_TRUE(ft::same_bits(y2, y));
  EXPECT_TRUE(ft::same_bits(dx2, dx));
  EXPECT_TRUE(ft::same_bits(dw2, dw));
  EXPECT_TRUE(ft::same_bits(db2, db));
  EXPECT_GT(ft::l2_norm(y), 0.0);
}

TEST(Linear, Float64GradientsWithoutSplitInvariantMath) {
  // dw's dtype alone selects the exact accumulation; y and dx use BLAS.
  Context ctx(Device::cpu());
  std::mt19937_64 rng(35);
  Tensor x = ft::random_tensor(Shape{6, 9}, rng), w = ft::random_tensor(Shape{4, 9}, rng);
  Tensor dy = ft::random_tensor(Shape{6, 4}, rng), dx = Tensor::empty(Shape{6, 9});
  Tensor dw = Tensor::zeros(Shape{4, 9}, DType::F64), db = Tensor::zeros(Shape{4}, DType::F64);
  kernels::linear_backward(ctx, x, w, dy, &dx, dw, &db);
  LinearRef r = naive_linear(x, w, nullptr, dy);
  expect_close(dx, r.dx, 1e-5, "dx");
  for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.f64()[i], r.dw[i], 1e-6) << "dw at " << i;
  for (int64_t i = 0; i < db.numel(); ++i) ASSERT_NEAR(db.f64()[i], r.db[i], 1e-12) << "db at " << i;
  // A float64 dw with a float32 db (or the reverse) is a caller error.
  Tensor db32 = Tensor::zeros(Shape{4});
  EXPECT_THROW(kernels::linear_backward(ctx, x, w, dy, &dx, dw, &db32), Error);
}

TEST(Linear, ShapeMismatchesThrow) {
  Context ctx(Device::cpu());
  Tensor x = Tensor::zeros(Shape{3, 5}), w = Tensor::zeros(Shape{4, 6}), y = Tensor::zeros(Shape{3, 4});
  EXPECT_THROW(kernels::linear_forward(ctx, x, w, nullptr, y), Error);
  Tensor w2 = Tensor::zeros(Shape{4, 5}), b = Tensor::zeros(Shape{5}), y2 = Tensor::zeros(Shape{3, 5});
  EXPECT_THROW(kernels::linear_forward(ctx, x, w2, &b, y), Error);  // bias of the wrong length
  EXPECT_THROW(kernels::linear_forward(ctx, x, w2, nullptr, y2), Error);
  Tensor dw = Tensor::zeros(Shape{5, 4}), dy = Tensor::zeros(Shape{3, 4});
  EXPECT_THROW(kernels::linear_backward(ctx, x, w2, dy, nullptr, dw, nullptr), Error);
  Tensor dw_ok = Tensor::zeros(Shape{4, 5}), dx_bad = Tensor::zeros(Shape{3, 4});
  EXPECT_THROW(kernels::linear_backward(ctx, x, w2, dy, &dx_bad, dw_ok, nullptr), Error);
  Tensor x3 = Tensor::zeros(Shape{3, 5, 1});
  EXPECT_THROW(kernels::linear_forward(ctx, x3, w2, nullptr, y), Error);
  try {
    kernels::linear_forward(ctx, x, w, nullptr, y);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("linear_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3, 5)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(4, 6)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
