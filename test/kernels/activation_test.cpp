// ReLU forward/backward on every backend: reference values over sizes that
// are not multiples of a block, in-place aliasing, NaN propagation, central
// differences away from the kink, shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/activation.h"
#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

FANOUT_BACKEND_SUITE(Relu);

TEST_P(Relu, ForwardBackwardAndInPlace) {
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{257}, int64_t{3 * 5 * 7 * 9}, int64_t{100003}}) {
    SCOPED_TRACE(n);
    std::mt19937_64 rng(static_cast<uint64_t>(n) + 41);
    Tensor x = ft::random_tensor(Shape{n}, rng), dy = ft::random_tensor(Shape{n}, rng);
    x.f32()[0] = 0.5f;  // at least one positive element, so norms are non-zero
    Tensor xd = up(x), dyd = up(dy), yd = poisoned(x.shape()), dxd = poisoned(x.shape());
    kernels::relu_forward(ctx(), xd, yd);
    kernels::relu_backward(ctx(), yd, dyd, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(y.f32()[i], std::max(0.0f, x.f32()[i])) << i;
      ASSERT_EQ(dx.f32()[i], x.f32()[i] > 0 ? dy.f32()[i] : 0.0f) << i;
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    // In place: y aliases x, dx aliases dy.
    kernels::relu_forward(ctx(), xd, xd);
    kernels::relu_backward(ctx(), xd, dyd, dyd);
    EXPECT_TRUE(ft::same_bits(down(xd), y)) << "y in place";
    EXPECT_TRUE(ft::same_bits(down(dyd), dx)) << "dx in place";
  }
}

TEST_P(Relu, NanPropagates) {
  // As torch.relu.
  Tensor n = Tensor::empty(Shape{1});
  n.f32()[0] = std::numeric_limits<float>::quiet_NaN();
  Tensor nd = up(n);
  kernels::relu_forward(ctx(), nd, nd);
  EXPECT_TRUE(std::isnan(down(nd).f32()[0]));
}

TEST_P(Relu, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(42);
  Tensor x = ft::random_tensor(Shape{3, 5, 7}, rng), r = ft::random_tensor(Shape{3, 5, 7}, rng);
  Tensor xd = up(x), rd = up(r), yd = poisoned(x.shape()), dxd = poisoned(x.shape());
  kernels::relu_forward(ctx(), xd, yd);
  kernels::relu_backward(ctx(), yd, rd, dxd);
  const Tensor dx = down(dxd);
  auto loss = [&] {
    Tensor xe = up(x);  // lives until down() has waited for the op
    kernels::relu_forward(ctx(), xe, yd);
    return ft::dot(down(yd), r);
  };
  auto res = ft::grad_check_detail(loss, x, dx, 1e-3);
  EXPECT_LT(res.worst, 1e-2);
  EXPECT_GT(res.checked, 100);
}

TEST_P(Relu, LowStorageInEitherFormat) {
  // ReLU only selects: the stored values come back exactly, in the input's type and format.
  for (const ft::StorageCase& sc : ft::low_storage_cases()) {
    SCOPED_TRACE(sc.name());
    std::mt19937_64 rng(44);
    const Shape s{2, 5, 3, 7};
    const Tensor x = ft::random_stored(s, sc.dtype, sc.format, rng), dy = ft::random_stored(s, sc.dtype, sc.format, rng);
    Tensor xd = up(x), dyd = up(dy), yd = up(ft::poisoned_stored(s, sc.dtype, sc.format)),
           dxd = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    kernels::relu_forward(ctx(), xd, yd);
    kernels::relu_backward(ctx(), yd, dyd, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    ASSERT_EQ(y.format(), sc.format);
    int64_t positive = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float xv = ft::stored(x, i);
      positive += xv > 0;
      ASSERT_EQ(ft::stored(y, i), std::max(0.0f, xv)) << i;
      ASSERT_EQ(ft::stored(dx, i), xv > 0 ? ft::stored(dy, i) : 0.0f) << i;
    }
    EXPECT_GT(positive, 0);
    kernels::relu_forward(ctx(), xd, xd);
    EXPECT_TRUE(ft::same_bits(down(xd), y)) << "y in place";
  }
}

TEST_P(Relu, MixedTypesAndFormatsThrow) {
  Tensor x = up(Tensor::zeros(Shape{2, 3, 4, 5}, DType::BF16));
  Tensor y16 = up(Tensor::zeros(Shape{2, 3, 4, 5}, DType::F16));
  Tensor ycl = up(Tensor::zeros(Shape{2, 3, 4, 5}, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast));
  EXPECT_THROW(kernels::relu_forward(ctx(), x, y16), Error);
  EXPECT_THROW(kernels::relu_forward(ctx(), x, ycl), Error);
  Tensor x64 = up(Tensor::zeros(Shape{2, 3, 4, 5}, DType::F64));
  EXPECT_THROW(kernels::relu_forward(ctx(), x64, x64), Error);
}

TEST_P(Relu, ShapeMismatchThrows) {
  Tensor x = up(Tensor::zeros(Shape{3, 5})), y = up(Tensor::zeros(Shape{5, 3}));
  EXPECT_THROW(kernels::relu_forward(ctx(), x, y), Error);
  Tensor dx = up(Tensor::zeros(Shape{3, 5})), dy = up(Tensor::zeros(Shape{15}));
  EXPECT_THROW(kernels::relu_backward(ctx(), x, dy, dx), Error);
  Tensor xi = up(Tensor::zeros(Shape{3, 5}, DType::I32));
  EXPECT_THROW(kernels::relu_forward(ctx(), xi, dx), Error);
}


// Tanh, Sigmoid, GELU, SiLU and LeakyReLU on every backend: forward and
// backward against their formulas in float64 (torch's definitions; GELU the
// exact erf form), over values from -20 to 20 (saturation included), in place,
// NaN propagating, and the backward against central differences of the
// float64 forward.
namespace smooth {

double f64(kernels::Act k, double x, double slope) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  switch (k) {
    case kernels::Act::Tanh: return std::tanh(x);
    case kernels::Act::Sigmoid: return s;
    case kernels::Act::Gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case kernels::Act::Silu: return x * s;
    case kernels::Act::LeakyRelu: return x > 0 ? x : slope * x;
  }
  return 0;
}

double df64(kernels::Act k, double x, double slope) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  switch (k) {
    case kernels::Act::Tanh: return 1.0 - std::tanh(x) * std::tanh(x);
    case kernels::Act::Sigmoid: return s * (1.0 - s);
    case kernels::Act::Gelu:
      return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    case kernels::Act::Silu: return s * (1.0 + x * (1.0 - s));
    case kernels::Act::LeakyRelu: return x > 0 ? 1.0 : slope;
  }
  return 0;
}

const kernels::Activation kAll[] = {{kernels::Act::Tanh}, {kernels::Act::Sigmoid}, {kernels::Act::Gelu},
                                    {kernels::Act::Silu}, {kernels::Act::LeakyRelu, 0.2f}};

}  // namespace smooth

FANOUT_BACKEND_SUITE(SmoothActivation);

TEST_P(SmoothActivation, MatchFormulasInFloat64) {
  for (const kernels::Activation& a : smooth::kAll) {
    SCOPED_TRACE(kernels::activation_name(a.kind));
    for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{10007}}) {
      std::mt19937_64 rng(static_cast<uint64_t>(n) + 7);
      Tensor x = ft::random_tensor(Shape{n}, rng, -20.0f, 20.0f), dy = ft::random_tensor(Shape{n}, rng);
      Tensor xd = up(x), dyd = up(dy), yd = poisoned(x.shape()), dxd = poisoned(x.shape());
      kernels::activation_forward(ctx(), a, xd, yd);
      kernels::activation_backward(ctx(), a, xd, dyd, dxd);
      std::vector<double> y(n), dx(n);
      for (int64_t i = 0; i < n; ++i) {
        y[i] = smooth::f64(a.kind, x.f32()[i], a.negative_slope);
        dx[i] = dy.f32()[i] * smooth::df64(a.kind, x.f32()[i], a.negative_slope);
      }
      const Tensor got_y = down(yd), got_dx = down(dxd);
      for (int64_t i = 0; i < n; ++i) {
        // float32 libm / CUDA intrinsics against double: a few ulps of the value, or of 1e-6 near zero.
        ASSERT_NEAR(got_y.f32()[i], y[i], 4e-6 * std::max(std::abs(y[i]), 1.0)) << "x " << x.f32()[i];
        ASSERT_NEAR(got_dx.f32()[i], dx[i], 4e-6 * std::max(std::abs(dx[i]), 1.0)) << "x " << x.f32()[i];
      }
      EXPECT_GT(ft::l2_norm(got_y), 0.0);
      EXPECT_GT(ft::l2_norm(got_dx), 0.0);
      // In place: y over x, dx over dy (from the saved input).
      Tensor xin = up(x), xs = up(x);
      kernels::activation_forward(ctx(), a, xin, xin);
      EXPECT_TRUE(ft::same_bits(down(xin), got_y)) << "y in place";
      kernels::activation_backward(ctx(), a, xs, dyd, dyd);
      EXPECT_TRUE(ft::same_bits(down(dyd), got_dx)) << "dx in place";
    }
  }
}

TEST_P(SmoothActivation, LowStorageMatchesFloat64OfTheStoredInputs) {
  // float32 arithmetic on the widened inputs, one rounding to the type as it is stored.
  for (const ft::StorageCase& sc : ft::low_storage_cases())
    for (const kernels::Activation& a : smooth::kAll) {
      SCOPED_TRACE(sc.name() + " " + kernels::activation_name(a.kind));
      std::mt19937_64 rng(45);
      const Shape s{3, 6, 5, 4};
      const Tensor x = ft::random_stored(s, sc.dtype, sc.format, rng, -6.0f, 6.0f),
                   dy = ft::random_stored(s, sc.dtype, sc.format, rng);
      Tensor xd = up(x), dyd = up(dy), yd = up(ft::poisoned_stored(s, sc.dtype, sc.format)),
             dxd = up(ft::poisoned_stored(s, sc.dtype, sc.format));
      kernels::activation_forward(ctx(), a, xd, yd);
      kernels::activation_backward(ctx(), a, xd, dyd, dxd);
      const Tensor y = down(yd), dx = down(dxd);
      // The float32 kernel on the widened inputs, rounded once as stored: the same bits.
      Tensor x32 = Tensor::empty(s), dy32 = Tensor::empty(s);
      for (int64_t i = 0; i < x.numel(); ++i) {
        x32.f32()[i] = ft::stored(x, i);
        dy32.f32()[i] = ft::stored(dy, i);
      }
      Tensor x32d = up(x32), dy32d = up(dy32), y32d = poisoned(s), dx32d = poisoned(s);
      kernels::activation_forward(ctx(), a, x32d, y32d);
      kernels::activation_backward(ctx(), a, x32d, dy32d, dx32d);
      EXPECT_TRUE(ft::same_bits(ft::stored_copy(down(y32d), sc.dtype, sc.format), y)) << "y";
      EXPECT_TRUE(ft::same_bits(ft::stored_copy(down(dx32d), sc.dtype, sc.format), dx)) << "dx";
      const double u = ft::unit_roundoff(sc.dtype) * (1 + 1e-3);
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double xv = ft::stored(x, i);
        const double want_y = smooth::f64(a.kind, xv, a.negative_slope);
        const double want_dx = ft::stored(dy, i) * smooth::df64(a.kind, xv, a.negative_slope);
        ASSERT_NEAR(ft::stored(y, i), want_y, u * std::abs(want_y) + 4e-6 * std::max(1.0, std::abs(want_y)))
            << "x " << xv;
        ASSERT_NEAR(ft::stored(dx, i), want_dx, u * std::abs(want_dx) + 4e-6 * std::max(1.0, std::abs(want_dx)))
            << "x " << xv;
      }
    }
}

TEST_P(SmoothActivation, BackwardMatchesCentralDifferences) {
  for (const kernels::Activation& a : smooth::kAll) {
    SCOPED_TRACE(kernels::activation_name(a.kind));
    std::mt19937_64 rng(43);
    Tensor x = ft::random_tensor(Shape{3, 5, 7}, rng, -3.0f, 3.0f), r = ft::random_tensor(Shape{3, 5, 7}, rng);
    for (int64_t i = 0; i < x.numel(); ++i)  // away from LeakyReLU's kink
      if (std::abs(x.f32()[i]) < 1e-2f) x.f32()[i] = 0.5f;
    Tensor xd = up(x), rd = up(r), dxd = poisoned(x.shape());
    kernels::activation_backward(ctx(), a, xd, rd, dxd);
    const Tensor dx = down(dxd);
    const double h = 1e-4;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xi = x.f32()[i];
      const double num = r.f32()[i] * (smooth::f64(a.kind, xi + h, a.negative_slope) -
                                       smooth::f64(a.kind, xi - h, a.negative_slope)) / (2 * h);
      ASSERT_NEAR(dx.f32()[i], num, 1e-4 * std::max(1.0, std::abs(num))) << "x " << xi;
    }
  }
}

TEST_P(SmoothActivation, NanPropagates) {
  for (const kernels::Activation& a : smooth::kAll) {
    Tensor n = Tensor::empty(Shape{1});
    n.f32()[0] = std::numeric_limits<float>::quiet_NaN();
    Tensor nd = up(n);
    kernels::activation_forward(ctx(), a, nd, nd);
    EXPECT_TRUE(std::isnan(down(nd).f32()[0])) << kernels::activation_name(a.kind);
  }
}
}  // namespace
}  // namespace fanout
