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

struct Reference {
  std::vector<double> y, mean, rstd, dx, dgamma, dbeta;
};

// torch.nn.functional.group_norm and its gradients, in double from the
// statistics as the op keeps them (float).
Reference reference(const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& dy, int groups, double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c), cg = c / groups, m = cg * s;
  Reference r;
  r.y.resize(x.numel());
  r.dx.resize(x.numel());
  r.dgamma.assign(c, 0.0);
  r.dbeta.assign(c, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t gr = 0; gr < groups; ++gr) {
      const int64_t base = (i * c + gr * cg) * s;
      const ft::Moments mom = ft::moments64(x.f32() + base, m);
      double mu = mom.mean;
      r.mean.push_back(mu);
      r.rstd.push_back(1 / std::sqrt(mom.var + eps));
      // The op keeps its statistics in float (as torch does) and normalizes
      // with those: with two values per group and a variance near eps the
      // rounding of the mean alone moves dx by 1e-5.
      mu = static_cast<float>(mu);
      const double rs = static_cast<float>(r.rstd.back());
      double sd = 0, sdx = 0;
      for (int64_t k = 0; k < m; ++k) {
        const int64_t cc = gr * cg + k / s;
        const double xh = (x.f32()[base + k] - mu) * rs;
        r.y[base + k] = xh * g.f32()[cc] + b.f32()[cc];
        const double dxh = dy.f32()[base + k] * g.f32()[cc];
        sd += dxh;
        sdx += dxh * xh;
        r.dgamma[cc] += dy.f32()[base + k] * xh;
        r.dbeta[cc] += dy.f32()[base + k];
      }
      for (int64_t k = 0; k < m; ++k) {
        const int64_t cc = gr * cg + k / s;
        const double xh = (x.f32()[base + k] - mu) * rs;
        r.dx[base + k] = rs * (dy.f32()[base + k] * g.f32()[cc] - sd / m - xh * sdx / m);
      }
    }
  return r;
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
    const Reference want = reference(x, g, b, dy, cs.groups, 1e-5);
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
