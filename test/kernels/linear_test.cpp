// Fully connected layer on every backend: forward against a naive double
// reference; backward against the double reference and central differences;
// += semantics; split-invariant and float64-gradient math (CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/linear.h"
#include "kernels/storage_test_util.h"
#include "runtime/core/error.h"

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

FANOUT_BACKEND_SUITE(LinearOnBackend);

TEST_P(LinearOnBackend, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(31);
  struct Case {
    int64_t n, in, out;
    bool bias, dx;
  };
  for (const Case& c : {Case{3, 7, 5, true, true}, Case{3, 7, 5, false, true}, Case{37, 129, 10, true, true},
                        Case{13, 33, 65, false, true}, Case{5, 257, 3, true, false}}) {
    SCOPED_TRACE(::testing::Message() << c.n << "x" << c.in << " -> " << c.out << " bias " << c.bias << " dx "
                                      << c.dx);
    Tensor x = ft::random_tensor(Shape{c.n, c.in}, rng), w = ft::random_tensor(Shape{c.out, c.in}, rng);
    Tensor b = ft::random_tensor(Shape{c.out}, rng), dy = ft::random_tensor(Shape{c.n, c.out}, rng);
    Tensor dw0 = ft::random_tensor(Shape{c.out, c.in}, rng), db0 = ft::random_tensor(Shape{c.out}, rng);
    Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(dw0), dbd = up(db0);
    Tensor yd = poisoned(Shape{c.n, c.out}), dxd = poisoned(Shape{c.n, c.in});
    kernels::linear_forward(ctx(), xd, wd, c.bias ? &bd : nullptr, yd);
    kernels::linear_backward(ctx(), xd, wd, dyd, c.dx ? &dxd : nullptr, dwd, c.bias ? &dbd : nullptr);
    const Tensor y = down(yd), dx = down(dxd), dw = down(dwd), db = down(dbd);
    LinearRef r = naive_linear(x, w, c.bias ? &b : nullptr, dy);
    EXPECT_TRUE(matches(y, r.y, 1e-5, 1e-4)) << "y";
    if (c.dx) {
      EXPECT_TRUE(matches(dx, r.dx, 1e-5, 1e-4)) << "dx";
      EXPECT_GT(ft::l2_norm(dx), 0.0);
    }
    for (int64_t i = 0; i < dw.numel(); ++i) r.dw[i] += dw0.f32()[i];  // += onto the initial gradient
    EXPECT_TRUE(matches(dw, r.dw, 1e-5, 1e-4)) << "dw (+=)";
    if (c.bias) {
      for (int64_t i = 0; i < db.numel(); ++i) r.db[i] += db0.f32()[i];
      EXPECT_TRUE(matches(db, r.db, 1e-5, 1e-4)) << "db (+=)";
    } else {
      EXPECT_TRUE(ft::same_bits(db, db0)) << "db untouched without a bias";
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
  }
}

// Whether v is a value of type t (rounding it changes nothing).
bool representable(float v, DType t) {
  const float r = t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(v))
                                   : half::float_from_f16(half::f16_from_float(v));
  return r == v || (std::isnan(r) && std::isnan(v));
}

// Under autocast, activations stored in the low type (x, y, dy, dx), the
// weight and bias float32 holding low-type values (as the layer rounds
// them): y and dx within one rounding of the double formulas on the stored
// values. dw and db are float32 sums within float32's error, except where
// the kernels round in the low type (kernels::linear_rounds_in_low_type):
// there dW's term is rounded to it, one rounding from the double sum.
TEST_P(LinearOnBackend, LowTypeActivations) {
  std::mt19937_64 rng(35);
  const int64_t n = 9, in = 40, out = 12;
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor xs = ft::random_stored(Shape{n, in}, t, MemoryFormat::Contiguous, rng);
    const Tensor dys = ft::random_stored(Shape{n, out}, t, MemoryFormat::Contiguous, rng);
    const Tensor w = ft::float32_values(ft::random_stored(Shape{out, in}, t, MemoryFormat::Contiguous, rng));
    const Tensor b = ft::float32_values(ft::random_stored(Shape{out}, t, MemoryFormat::Contiguous, rng));
    const LinearRef ref = naive_linear(ft::float32_values(xs), w, &b, ft::float32_values(dys));
    ctx().math.autocast = t;
    const bool rounds = kernels::linear_rounds_in_low_type(ctx());
    Tensor y = up(ft::poisoned_stored(Shape{n, out}, t, MemoryFormat::Contiguous));
    Tensor dx = up(ft::poisoned_stored(Shape{n, in}, t, MemoryFormat::Contiguous));
    Tensor dw = up(Tensor::zeros(Shape{out, in})), db = up(Tensor::zeros(Shape{out}));
    const Tensor xd = up(xs), wd = up(w), bd = up(b);
    kernels::linear_forward(ctx(), xd, wd, &bd, y);
    kernels::linear_backward(ctx(), xd, wd, up(dys), &dx, dw, &db);
    ctx().math.autocast = DType::F32;
    const Tensor yh = down(y), dxh = down(dx), dwh = down(dw), dbh = down(db);
    ASSERT_EQ(yh.dtype(), t);
    ASSERT_EQ(dxh.dtype(), t);
    const double u = ft::unit_roundoff(t);
    for (int64_t i = 0; i < n * out; ++i) ASSERT_NEAR(ft::stored(yh, i), ref.y[i], u * std::abs(ref.y[i]) + 1e-5) << i;
    for (int64_t i = 0; i < n * in; ++i)
      ASSERT_NEAR(ft::stored(dxh, i), ref.dx[i], u * std::abs(ref.dx[i]) + 1e-5) << i;
    if (rounds) {
      for (int64_t i = 0; i < out * in; ++i) {
        ASSERT_TRUE(representable(dwh.f32()[i], t)) << "dw's term rounded, at " << i << ": " << dwh.f32()[i];
        ASSERT_NEAR(dwh.f32()[i], ref.dw[i], u * std::abs(ref.dw[i]) + 1e-5) << "dw at " << i;
      }
    } else {
      expect_close(dwh, ref.dw, 1e-5, "dw");
    }
    expect_close(dbh, ref.db, 1e-5, "db");
  }
}

// Where the kernels round in the low type, they take float32 operands of
// any values and round them as they read them: every output is what the
// rounded operands give (one rounding of the double formulas on them), y
// and dx stored float32 hold low-type values, and dW's term is rounded
// before it is added to dw's float32 values. Where they do not (a CPU
// without the type's instructions), autocast changes nothing in them: the
// float32 kernels' bits (the layers round around them: LowTypeActivations).
TEST_P(LinearOnBackend, RoundsFloat32OperandsInTheLowType) {
  std::mt19937_64 rng(36);
  const int64_t n = 11, in = 70, out = 17;
  int checked = 0, in_float32 = 0;
  for (DType t : {DType::BF16, DType::F16}) {
    ctx().math.autocast = t;
    const bool rounds = kernels::linear_rounds_in_low_type(ctx());
    ctx().math.autocast = DType::F32;
    SCOPED_TRACE(dtype_name(t));
    if (!rounds) {
      ++in_float32;
      const Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
      const Tensor b = ft::random_tensor(Shape{out}, rng), dy = ft::random_tensor(Shape{n, out}, rng);
      const Tensor dw0 = ft::random_tensor(Shape{out, in}, rng);
      const Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy);
      Tensor got[2][3];  // autocast off, on: y, dx, dw
      for (int on = 0; on < 2; ++on) {
        ctx().math.autocast = on ? t : DType::F32;
        Tensor y = poisoned(Shape{n, out}), dx = poisoned(Shape{n, in}), dw = up(dw0);
        kernels::linear_forward(ctx(), xd, wd, &bd, y);
        kernels::linear_backward(ctx(), xd, wd, dyd, &dx, dw, nullptr);
        got[on][0] = down(y);
        got[on][1] = down(dx);
        got[on][2] = down(dw);
      }
      ctx().math.autocast = DType::F32;
      EXPECT_TRUE(ft::same_bits(got[1][0], got[0][0])) << "y";
      EXPECT_TRUE(ft::same_bits(got[1][1], got[0][1])) << "dx";
      EXPECT_TRUE(ft::same_bits(got[1][2], got[0][2])) << "dw";
      const LinearRef ref = naive_linear(x, w, &b, dy);  // and the float32 kernels' values
      for (int64_t i = 0; i < n * out; ++i) ASSERT_NEAR(got[1][0].f32()[i], ref.y[i], 1e-4) << "y at " << i;
      continue;
    }
    ++checked;
    const Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
    const Tensor b = ft::float32_values(ft::random_stored(Shape{out}, t, MemoryFormat::Contiguous, rng));
    const Tensor dy = ft::random_tensor(Shape{n, out}, rng), dw0 = ft::random_tensor(Shape{out, in}, rng);
    const auto rounded = [&](const Tensor& v) {
      return ft::float32_values(ft::stored_copy(v, t, MemoryFormat::Contiguous));
    };
    const LinearRef ref = naive_linear(rounded(x), rounded(w), &b, rounded(dy));
    ctx().math.autocast = t;
    Tensor y = poisoned(Shape{n, out}), dx = poisoned(Shape{n, in}), dw = up(dw0);
    const Tensor xd = up(x), wd = up(w), bd = up(b);
    kernels::linear_forward(ctx(), xd, wd, &bd, y);
    kernels::linear_backward(ctx(), xd, wd, up(dy), &dx, dw, nullptr);
    ctx().math.autocast = DType::F32;
    const Tensor yh = down(y), dxh = down(dx), dwh = down(dw);
    const double u = ft::unit_roundoff(t);
    for (int64_t i = 0; i < n * out; ++i) {
      ASSERT_TRUE(representable(yh.f32()[i], t)) << "y at " << i;
      ASSERT_NEAR(yh.f32()[i], ref.y[i], u * std::abs(ref.y[i]) + 1e-5) << "y at " << i;
    }
    for (int64_t i = 0; i < n * in; ++i) {
      ASSERT_TRUE(representable(dxh.f32()[i], t)) << "dx at " << i;
      ASSERT_NEAR(dxh.f32()[i], ref.dx[i], u * std::abs(ref.dx[i]) + 1e-5) << "dx at " << i;
    }
    for (int64_t i = 0; i < out * in; ++i) {
      // dw = dw0 + term, the term one rounding from the double sum: the
      // difference is that term's value, up to float32's rounding of the add.
      const double term = static_cast<double>(dwh.f32()[i]) - dw0.f32()[i];
      ASSERT_NEAR(term, ref.dw[i], u * std::abs(ref.dw[i]) + 1e-5 + 1e-7 * std::abs(dw0.f32()[i])) << "dw at " << i;
    }
    // w stored in the low type (the layer's one cast a step): the same bits as the float32 w.
    {
      Tensor yl = poisoned(Shape{n, out}), dxl = poisoned(Shape{n, in}), dwl = up(dw0);
      const Tensor wl = up(ft::stored_copy(w, t, MemoryFormat::Contiguous));
      ctx().math.autocast = t;
      kernels::linear_forward(ctx(), xd, wl, &bd, yl);
      kernels::linear_backward(ctx(), xd, wl, up(dy), &dxl, dwl, nullptr);
      ctx().math.autocast = DType::F32;
      EXPECT_TRUE(ft::same_bits(down(yl), yh)) << "y";
      EXPECT_TRUE(ft::same_bits(down(dxl), dxh)) << "dx";
      EXPECT_TRUE(ft::same_bits(down(dwl), dwh)) << "dw";
      // Outside autocast a low-type w is refused.
      Tensor yf = poisoned(Shape{n, out});
      EXPECT_THROW(kernels::linear_forward(ctx(), xd, wl, &bd, yf), Error);
    }
    // The operands themselves are rounded before the product: with x = w =
    // 1 + 5 * 2^-9 (1 + 2^-7 in bfloat16) y is round((1 + 2^-7)^2) = 1 + 2^-6,
    // where the exact product would round to 1 + 3 * 2^-7.
    if (t == DType::BF16) {
      const float v = 1.0f + 5.0f / 512.0f;
      Tensor one = Tensor::empty(Shape{1, 1});
      one.f32()[0] = v;
      Tensor y1 = poisoned(Shape{1, 1});
      ctx().math.autocast = t;
      kernels::linear_forward(ctx(), up(one), up(one), nullptr, y1);
      ctx().math.autocast = DType::F32;
      EXPECT_EQ(down(y1).f32()[0], 1.0f + 1.0f / 64.0f) << "x and w rounded before the product";
    }
    // No rows: nothing written, dw unchanged.
    ctx().math.autocast = t;
    Tensor y0 = poisoned(Shape{0, out}), dx0 = poisoned(Shape{0, in}), dwz = up(dw0);
    kernels::linear_forward(ctx(), up(Tensor::empty(Shape{0, in})), wd, &bd, y0);
    kernels::linear_backward(ctx(), up(Tensor::empty(Shape{0, in})), wd, up(Tensor::empty(Shape{0, out})), &dx0, dwz,
                             nullptr);
    ctx().math.autocast = DType::F32;
    EXPECT_TRUE(ft::same_bits(down(dwz), dw0)) << "dw with no rows";
  }
  if (ctx().device().is_cuda()) EXPECT_EQ(checked, 2) << "CUDA rounds in both low types";
  EXPECT_EQ(checked + in_float32, 2);
}

TEST_P(LinearOnBackend, GradientsByCentralDifferences) {
  std::mt19937_64 rng(32);
  const int64_t n = 3, in = 9, out = 5;
  Tensor x = ft::random_tensor(Shape{n, in}, rng), w = ft::random_tensor(Shape{out, in}, rng);
  Tensor b = ft::random_tensor(Shape{out}, rng), r = ft::random_tensor(Shape{n, out}, rng);
  Tensor yd = poisoned(Shape{n, out});
  auto loss = [&] {
    Tensor xe = up(x), we = up(w), be = up(b);
    kernels::linear_forward(ctx(), xe, we, &be, yd);
    return ft::dot(down(yd), r);
  };
  Tensor xd = up(x), wd = up(w), rd = up(r), dxd = poisoned(Shape{n, in});
  Tensor dwd = up(Tensor::zeros(Shape{out, in})), dbd = up(Tensor::zeros(Shape{out}));
  kernels::linear_backward(ctx(), xd, wd, rd, &dxd, dwd, &dbd);
  const Tensor dx = down(dxd), dw = down(dwd), db = down(dbd);
  for (auto [t, g, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
    auto res = ft::grad_check_detail(loss, *t, *g);
    EXPECT_LT(res.worst, 1e-2) << name;
    EXPECT_EQ(res.checked, static_cast<int>(t->numel())) << name;
    EXPECT_GT(ft::l2_norm(*g), 0.0) << name;
  }
}

TEST_P(LinearOnBackend, BackwardAccumulatesParameterGradients) {
  std::mt19937_64 rng(33);
  Tensor x = up(ft::random_tensor(Shape{4, 6}, rng)), w = up(ft::random_tensor(Shape{3, 6}, rng));
  Tensor dy = up(ft::random_tensor(Shape{4, 3}, rng));
  Tensor dw = up(Tensor::zeros(Shape{3, 6})), db = up(Tensor::zeros(Shape{3}));
  kernels::linear_backward(ctx(), x, w, dy, nullptr, dw, &db);
  const Tensor dw1 = down(dw), db1 = down(db);
  Tensor dx = poisoned(Shape{4, 6});
  kernels::linear_backward(ctx(), x, w, dy, &dx, dw, &db);
  const Tensor dw2 = down(dw), db2 = down(db);
  for (int64_t i = 0; i < dw2.numel(); ++i) EXPECT_NEAR(dw2.f32()[i], 2 * dw1.f32()[i], 1e-6);
  for (int64_t i = 0; i < db2.numel(); ++i) EXPECT_NEAR(db2.f32()[i], 2 * db1.f32()[i], 1e-6);
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
  // dw's dtype alone selects the exact accumulation; y and dx use the GEMM.
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

TEST_P(LinearOnBackend, ShapeMismatchesThrow) {
  Context& ctx = this->ctx();
  Tensor x = up(Tensor::zeros(Shape{3, 5})), w = up(Tensor::zeros(Shape{4, 6})), y = up(Tensor::zeros(Shape{3, 4}));
  EXPECT_THROW(kernels::linear_forward(ctx, x, w, nullptr, y), Error);
  Tensor w2 = up(Tensor::zeros(Shape{4, 5})), b = up(Tensor::zeros(Shape{5})), y2 = up(Tensor::zeros(Shape{3, 5}));
  EXPECT_THROW(kernels::linear_forward(ctx, x, w2, &b, y), Error);  // bias of the wrong length
  EXPECT_THROW(kernels::linear_forward(ctx, x, w2, nullptr, y2), Error);
  Tensor dw = up(Tensor::zeros(Shape{5, 4})), dy = up(Tensor::zeros(Shape{3, 4}));
  EXPECT_THROW(kernels::linear_backward(ctx, x, w2, dy, nullptr, dw, nullptr), Error);
  Tensor dw_ok = up(Tensor::zeros(Shape{4, 5})), dx_bad = up(Tensor::zeros(Shape{3, 4}));
  EXPECT_THROW(kernels::linear_backward(ctx, x, w2, dy, &dx_bad, dw_ok, nullptr), Error);
  Tensor x3 = up(Tensor::zeros(Shape{3, 5, 1}));
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
