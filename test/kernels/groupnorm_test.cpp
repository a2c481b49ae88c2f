// Group normalization on every backend against torch's definition in
// float64: outputs, the saved statistics, dx, dgamma and dbeta (+=) for 2-D
// to 5-D inputs, one group (LayerNorm over C and positions) and one channel
// per group (InstanceNorm), dx written over dy, a sample's output
// independent of the batch, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/groupnorm.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// torch.nn.functional.group_norm and its gradients: rows of a (sample,
// group), each channel its own gamma and beta.
ft::NormReference reference(const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& dy, int groups,
                            double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c), cg = c / groups;
  return ft::norm_reference(x, g, b, dy, cg * s, eps,
                            [&](int64_t row, int64_t k) { return (row % groups) * cg + k / s; });
}

FANOUT_BACKEND_SUITE(GroupNormOnBackend);

TEST_P(GroupNormOnBackend, ForwardBackwardAgainstFloat64) {
  struct Case {
    Shape x;
    int groups;
  };
  const Case cases[] = {{Shape{2, 6, 5, 3}, 3},   {Shape{3, 4, 1, 2, 3}, 2}, {Shape{4, 8}, 4},
                        {Shape{2, 5, 7, 3}, 1},   {Shape{2, 5, 7, 3}, 5},    {Shape{1, 4, 33, 31}, 2}};
  std::mt19937_64 rng(71);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.x.str() + " groups " + std::to_string(cs.groups));
    const int64_t c = cs.x[1];
    Tensor x = ft::random_tensor(cs.x, rng, -2.0f, 3.0f), dy = ft::random_tensor(cs.x, rng);
    Tensor g = ft::random_tensor(Shape{c}, rng, 0.5f, 1.5f), b = ft::random_tensor(Shape{c}, rng);
    Tensor dg0 = ft::random_tensor(Shape{c}, rng), db0 = ft::random_tensor(Shape{c}, rng);  // += onto these
    const ft::NormReference want = reference(x, g, b, dy, cs.groups, 1e-5);
    Tensor xd = up(x), gd = up(g), bd = up(b), dyd = up(dy), dgd = up(dg0), dbd = up(db0);
    Tensor yd = poisoned(cs.x), md = poisoned(Shape{cs.x[0], cs.groups}), rd = poisoned(Shape{cs.x[0], cs.groups});
    Tensor dxd = poisoned(cs.x);
    kernels::group_norm_forward(ctx(), xd, gd, bd, cs.groups, 1e-5f, yd, md, rd);
    kernels::group_norm_backward(ctx(), xd, dyd, gd, md, rd, cs.groups, dxd, dgd, dbd);
    EXPECT_TRUE(matches(down(yd), want.y, 1e-5, 1e-5));
    EXPECT_TRUE(matches(down(md), want.mean, 1e-6, 1e-6));
    EXPECT_TRUE(matches(down(rd), want.rstd, 1e-5, 1e-5));
    EXPECT_TRUE(matches(down(dxd), want.dx, 1e-5, 1e-4));
    std::vector<double> dg(c), db(c);
    for (int64_t k = 0; k < c; ++k) {
      dg[k] = dg0.f32()[k] + want.dgamma[k];
      db[k] = db0.f32()[k] + want.dbeta[k];
    }
    EXPECT_TRUE(matches(down(dgd), dg, 1e-5, 1e-5));
    EXPECT_TRUE(matches(down(dbd), db, 1e-5, 1e-5));
    EXPECT_GT(ft::l2_norm(down(dxd)), 0.0);
    // dx written over dy: the same values.
    Tensor dy2 = up(dy), dg2 = up(dg0), db2 = up(db0);
    kernels::group_norm_backward(ctx(), xd, dy2, gd, md, rd, cs.groups, dy2, dg2, db2);
    EXPECT_TRUE(ft::same_bits(down(dy2), down(dxd))) << "dx over dy";
    EXPECT_TRUE(ft::same_bits(down(dg2), down(dgd)));
  }
}

// A sample's output does not depend on the others in its batch (unlike BatchNorm).
TEST_P(GroupNormOnBackend, SampleIndependentOfTheBatch) {
  std::mt19937_64 rng(72);
  Tensor x = ft::random_tensor(Shape{3, 4, 5, 5}, rng), g = ft::random_tensor(Shape{4}, rng);
  Tensor b = ft::random_tensor(Shape{4}, rng);
  Tensor xd = up(x), gd = up(g), bd = up(b), yd = poisoned(x.shape());
  Tensor md = poisoned(Shape{3, 2}), rd = poisoned(Shape{3, 2});
  kernels::group_norm_forward(ctx(), xd, gd, bd, 2, 1e-5f, yd, md, rd);
  Tensor one = x.slice(1, 2).to(Device::cpu());
  Tensor od = up(one), oy = poisoned(one.shape()), om = poisoned(Shape{1, 2}), orr = poisoned(Shape{1, 2});
  kernels::group_norm_forward(ctx(), od, gd, bd, 2, 1e-5f, oy, om, orr);
  EXPECT_TRUE(ft::same_bits(down(oy), down(yd).slice(1, 2).to(Device::cpu())));
}

TEST_P(GroupNormOnBackend, RefusesBadArguments) {
  Tensor x = up(Tensor::zeros(Shape{2, 6, 3})), g = up(Tensor::zeros(Shape{6})), y = up(Tensor::zeros(Shape{2, 6, 3}));
  Tensor m = up(Tensor::zeros(Shape{2, 4})), r = up(Tensor::zeros(Shape{2, 4}));
  EXPECT_THROW(kernels::group_norm_forward(ctx(), x, g, g, 4, 1e-5f, y, m, r), Error);  // 6 channels, 4 groups
  Tensor m3 = up(Tensor::zeros(Shape{2, 2})), r3 = up(Tensor::zeros(Shape{2, 3}));
  EXPECT_THROW(kernels::group_norm_forward(ctx(), x, g, g, 3, 1e-5f, y, m3, r3), Error);  // stats shape
  Tensor g5 = up(Tensor::zeros(Shape{5}));
  Tensor m2 = up(Tensor::zeros(Shape{2, 3})), r2 = up(Tensor::zeros(Shape{2, 3}));
  EXPECT_THROW(kernels::group_norm_forward(ctx(), x, g5, g5, 3, 1e-5f, y, m2, r2), Error);  // gamma
}

}  // namespace
}  // namespace fanout
