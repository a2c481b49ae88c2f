// ReLU forward/backward: reference values, in-place aliasing, central
// differences away from the kink, shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/activation.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

TEST(Relu, ForwardAndInPlace) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(41);
  Tensor x = ft::random_tensor(Shape{3, 5, 7, 9}, rng);
  Tensor y = Tensor::empty(x.shape());
  ft::poison(y);
  kernels::relu_forward(ctx, x, y);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y.f32()[i], std::max(0.0f, x.f32()[i]));
  EXPECT_GT(ft::l2_norm(y), 0.0);
  Tensor z = ft::clone(x);
  kernels::relu_forward(ctx, z, z);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(z.f32()[i], y.f32()[i]);
  // NaN propagates, as torch.relu.
  Tensor n = Tensor::empty(Shape{1});
  n.f32()[0] = std::numeric_limits<float>::quiet_NaN();
  kernels::relu_forward(ctx, n, n);
  EXPECT_TRUE(std::isnan(n.f32()[0]));
}

TEST(Relu, BackwardGradientAndAliasing) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(42);
  Tensor x = ft::random_tensor(Shape{3, 5, 7}, rng), r = ft::random_tensor(Shape{3, 5, 7}, rng);
  Tensor y = Tensor::empty(x.shape()), dx = Tensor::empty(x.shape());
  kernels::relu_forward(ctx, x, y);
  ft::poison(dx);
  kernels::relu_backward(ctx, y, r, dx);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(dx.f32()[i], x.f32()[i] > 0 ? r.f32()[i] : 0.0f);
  EXPECT_GT(ft::l2_norm(dx), 0.0);

  Tensor yy = Tensor::empty(x.shape());
  auto loss = [&] {
    kernels::relu_forward(ctx, x, yy);
    return ft::dot(yy, r);
  };
  auto res = ft::grad_check_detail(loss, x, dx, 1e-3);
  EXPECT_LT(res.worst, 1e-2);
  EXPECT_GT(res.checked, 100);

  // dx may alias dy.
  Tensor g = ft::clone(r);
  kernels::relu_backward(ctx, y, g, g);
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(g.f32()[i], dx.f32()[i]);
}

TEST(Relu, ShapeMismatchThrows) {
  Context ctx(Device::cpu());
  Tensor x = Tensor::zeros(Shape{3, 5}), y = Tensor::zeros(Shape{5, 3});
  EXPECT_THROW(kernels::relu_forward(ctx, x, y), Error);
  Tensor dx = Tensor::zeros(Shape{3, 5}), dy = Tensor::zeros(Shape{15});
  EXPECT_THROW(kernels::relu_backward(ctx, x, dy, dx), Error);
  Tensor xi = Tensor::zeros(Shape{3, 5}, DType::I32);
  EXPECT_THROW(kernels::relu_forward(ctx, xi, dx), Error);
}

}  // namespace
}  // namespace fanout
