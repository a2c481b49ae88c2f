// Layer normalization on every backend against torch's definition in
// float64: outputs, the saved statistics, dx, dgamma and dbeta (+=) for
// normalized shapes of one to three dims (rows of 1 to 1000 elements), dx
// written over dy, a row independent of the others, float64 parameter
// gradients (split-invariant) summed per sample, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/layernorm.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// torch.nn.functional.layer_norm and its gradients over rows of d = g's
// elements, elementwise gamma and beta.
ft::NormReference reference(const Tensor& x, const Tensor& g, const Tensor& b, const Tensor& dy, double eps) {
  return ft::norm_reference(x, g, b, dy, g.numel(), eps, [](int64_t, int64_t k) { return k; });
}

FANOUT_BACKEND_SUITE(LayerNormOnBackend);

TEST_P(LayerNormOnBackend, ForwardBackwardAgainstFloat64) {
  struct Case {
    Shape x, normalized;
  };
  const Case cases[] = {{Shape{4, 7, 16}, Shape{16}}, {Shape{3, 5}, Shape{5}},         {Shape{2, 3, 4, 5}, Shape{4, 5}},
                        {Shape{6, 1}, Shape{1}},      {Shape{2, 1000}, Shape{1000}}, {Shape{2, 3, 2, 3}, Shape{3, 2, 3}}};
  std::mt19937_64 rng(81);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.x.str() + " over " + cs.normalized.str());
    const int64_t rows = cs.x.numel() / cs.normalized.numel();
    Tensor x = ft::random_tensor(cs.x, rng, -2.0f, 3.0f), dy = ft::random_tensor(cs.x, rng);
    Tensor g = ft::random_tensor(cs.normalized, rng, 0.5f, 1.5f), b = ft::random_tensor(cs.normalized, rng);
    Tensor dg0 = ft::random_tensor(cs.normalized, rng), db0 = ft::random_tensor(cs.normalized, rng);  // += onto these
    const ft::NormReference want = reference(x, g, b, dy, 1e-5);
    Tensor xd = up(x), gd = up(g), bd = up(b), dyd = up(dy), dgd = up(dg0), dbd = up(db0);
    Tensor yd = poisoned(cs.x), md = poisoned(Shape{rows}), rd = poisoned(Shape{rows}), dxd = poisoned(cs.x);
    kernels::layer_norm_forward(ctx(), xd, gd, bd, 1e-5f, yd, md, rd);
    kernels::layer_norm_backward(ctx(), xd, dyd, gd, md, rd, dxd, dgd, dbd);
    EXPECT_TRUE(matches(down(yd), want.y, 1e-5, 1e-5));
    EXPECT_TRUE(matches(down(md), want.mean, 1e-6, 1e-6));
    EXPECT_TRUE(matches(down(rd), want.rstd, 1e-5, 1e-5));
    // A row of one element normalizes to 0: dx is 0 up to rounding.
    EXPECT_TRUE(matches(down(dxd), want.dx, 1e-5, 1e-4));
    std::vector<double> dg(g.numel()), db(g.numel());
    for (int64_t k = 0; k < g.numel(); ++k) {
      dg[k] = dg0.f32()[k] + want.dgamma[k];
      db[k] = db0.f32()[k] + want.dbeta[k];
    }
    EXPECT_TRUE(matches(down(dgd), dg, 1e-5, 1e-5));
    EXPECT_TRUE(matches(down(dbd), db, 1e-5, 1e-5));
    if (cs.normalized.numel() > 1) EXPECT_GT(ft::l2_norm(down(dxd)), 0.0);
    // dx written over dy: the same values.
    Tensor dy2 = up(dy), dg2 = up(dg0), db2 = up(db0);
    kernels::layer_norm_backward(ctx(), xd, dy2, gd, md, rd, dy2, dg2, db2);
    EXPECT_TRUE(ft::same_bits(down(dy2), down(dxd))) << "dx over dy";
    EXPECT_TRUE(ft::same_bits(down(dg2), down(dgd)));
  }
}

// A row's output does not depend on the other rows.
TEST_P(LayerNormOnBackend, RowIndependentOfTheBatch) {
  std::mt19937_64 rng(82);
  Tensor x = ft::random_tensor(Shape{3, 4, 8}, rng), g = ft::random_tensor(Shape{8}, rng);
  Tensor b = ft::random_tensor(Shape{8}, rng);
  Tensor xd = up(x), gd = up(g), bd = up(b), yd = poisoned(x.shape()), md = poisoned(Shape{12}), rd = poisoned(Shape{12});
  kernels::layer_norm_forward(ctx(), xd, gd, bd, 1e-5f, yd, md, rd);
  Tensor one = x.slice(1, 2).to(Device::cpu());
  Tensor od = up(one), oy = poisoned(one.shape()), om = poisoned(Shape{4}), orr = poisoned(Shape{4});
  kernels::layer_norm_forward(ctx(), od, gd, bd, 1e-5f, oy, om, orr);
  EXPECT_TRUE(ft::same_bits(down(oy), down(yd).slice(1, 2).to(Device::cpu())));
}

TEST_P(LayerNormOnBackend, RefusesBadArguments) {
  Tensor x = up(Tensor::zeros(Shape{2, 6})), g = up(Tensor::zeros(Shape{4})), y = up(Tensor::zeros(Shape{2, 6}));
  Tensor m = up(Tensor::zeros(Shape{3})), r = up(Tensor::zeros(Shape{3}));
  EXPECT_THROW(kernels::layer_norm_forward(ctx(), x, g, g, 1e-5f, y, m, r), Error);  // 6 is not rows of 4
  Tensor g6 = up(Tensor::zeros(Shape{6})), m1 = up(Tensor::zeros(Shape{1}));
  EXPECT_THROW(kernels::layer_norm_forward(ctx(), x, g6, g6, 1e-5f, y, m1, m1), Error);  // stats shape
}

// float64 parameter gradients (split-invariant math, CPU): each sample's sum
// is rounded to float and added exactly, so two halves of a batch give the
// whole batch's bits.
TEST(LayerNormExact, ParameterGradientsSumPerSample) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(83);
  Tensor x = ft::random_tensor(Shape{4, 3, 6}, rng), dy = ft::random_tensor(Shape{4, 3, 6}, rng);
  Tensor g = ft::random_tensor(Shape{6}, rng, 0.5f, 1.5f), b = ft::random_tensor(Shape{6}, rng);
  auto grads = [&](int64_t lo, int64_t hi, Tensor& dg, Tensor& db) {
    Tensor xs = x.slice(lo, hi), dys = dy.slice(lo, hi).to(Device::cpu());
    Tensor y = Tensor::empty(xs.shape()), m = Tensor::empty(Shape{(hi - lo) * 3}), r = Tensor::empty(Shape{(hi - lo) * 3});
    Tensor dx = Tensor::empty(xs.shape());
    kernels::layer_norm_forward(ctx, xs, g, b, 1e-5f, y, m, r);
    kernels::layer_norm_backward(ctx, xs, dys, g, m, r, dx, dg, db);
  };
  Tensor whole_g = Tensor::zeros(Shape{6}, DType::F64), whole_b = Tensor::zeros(Shape{6}, DType::F64);
  Tensor split_g = Tensor::zeros(Shape{6}, DType::F64), split_b = Tensor::zeros(Shape{6}, DType::F64);
  grads(0, 4, whole_g, whole_b);
  grads(0, 1, split_g, split_b);
  grads(1, 4, split_g, split_b);
  EXPECT_TRUE(ft::same_bits(whole_g, split_g));
  EXPECT_TRUE(ft::same_bits(whole_b, split_b));
}

}  // namespace
}  // namespace fanout
