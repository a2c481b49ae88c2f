// ReLU forward/backward on every backend: reference values over sizes that
// are not multiples of a block, in-place aliasing, NaN propagation, central
// differences away from the kink, shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/activation.h"
#include "kernels/backend_test_util.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

class Relu : public ft::BackendTest {};
FANOUT_ON_EVERY_BACKEND(Relu);

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

TEST_P(Relu, ShapeMismatchThrows) {
  Tensor x = up(Tensor::zeros(Shape{3, 5})), y = up(Tensor::zeros(Shape{5, 3}));
  EXPECT_THROW(kernels::relu_forward(ctx(), x, y), Error);
  Tensor dx = up(Tensor::zeros(Shape{3, 5})), dy = up(Tensor::zeros(Shape{15}));
  EXPECT_THROW(kernels::relu_backward(ctx(), x, dy, dx), Error);
  Tensor xi = up(Tensor::zeros(Shape{3, 5}, DType::I32));
  EXPECT_THROW(kernels::relu_forward(ctx(), xi, dx), Error);
}

}  // namespace
}  // namespace fanout
