// Fused SGD step on every backend against torch.optim.SGD's update computed
// in double, over several steps: plain, weight decay, momentum (first step:
// buf = grad), dampening, nesterov, sizes and misaligned views; and argument
// errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/sgd.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct SgdCase {
  const char* name;
  kernels::SgdHyper h;
};

class Sgd : public ft::BackendTest {};
FANOUT_ON_EVERY_BACKEND(Sgd);

TEST_P(Sgd, MatchesTorchFormulasOverSeveralSteps) {
  const SgdCase cases[] = {
      {"plain", {0.1f, 0.0f, 0.0f, 0.0f, false}},
      {"weight_decay", {0.05f, 0.0f, 0.0f, 0.01f, false}},
      {"momentum", {0.1f, 0.9f, 0.0f, 0.0f, false}},
      {"momentum_dampening", {0.1f, 0.9f, 0.3f, 0.0f, false}},
      {"momentum_dampening_wd", {0.1f, 0.8f, 0.5f, 5e-4f, false}},
      {"nesterov", {0.1f, 0.9f, 0.0f, 0.0f, true}},
      {"nesterov_wd", {0.05f, 0.9f, 0.0f, 1e-2f, true}},
  };
  std::mt19937_64 rng(91);
  for (const SgdCase& c : cases)
    for (int64_t n : {int64_t{37}, int64_t{1}, int64_t{1031}, int64_t{65537}})
      for (int64_t offset : {0, 1}) {  // offset 1: misaligned views
        SCOPED_TRACE(::testing::Message() << c.name << " n " << n << " offset " << offset);
        Tensor p = ft::random_tensor(Shape{n}, rng);
        Tensor pd_full = poisoned(Shape{n + offset}), bd_full = poisoned(Shape{n + offset});  // the first step must not read buf
        Tensor pd = pd_full.flat(offset, Shape{n}), bd = bd_full.flat(offset, Shape{n});
        pd.copy_from(up(p));
        std::vector<double> rp(p.f32(), p.f32() + n), rb(n, 0.0);
        const kernels::SgdHyper& h = c.h;
        for (int step = 0; step < 5; ++step) {
          Tensor g = ft::random_tensor(Shape{n}, rng);
          Tensor gd = up(g);
          const bool first = step == 0;
          kernels::sgd_step(ctx(), pd, gd, bd, h, first);
          const Tensor got = down(pd), buf = down(bd);
          for (int64_t i = 0; i < n; ++i) {
            double d = g.f32()[i] + double(h.weight_decay) * rp[i];
            if (h.momentum != 0) {
              rb[i] = first ? d : double(h.momentum) * rb[i] + (1 - double(h.dampening)) * d;
              d = h.nesterov ? d + double(h.momentum) * rb[i] : rb[i];
            }
            rp[i] -= double(h.lr) * d;
          }
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_NEAR(got.f32()[i], rp[i], 1e-5) << "step " << step << " at " << i;
            if (h.momentum != 0) {
              ASSERT_NEAR(buf.f32()[i], rb[i], 1e-5) << "step " << step << " at " << i;
            }
          }
          EXPECT_GT(ft::l2_norm(got), 0.0);
        }
      }
}

TEST_P(Sgd, NoMomentumNeedsNoBuffer) {
  std::mt19937_64 rng(92);
  Tensor p0 = ft::random_tensor(Shape{5, 3}, rng), g = ft::random_tensor(Shape{15}, rng), none;
  Tensor p = up(p0), gd = up(g);
  kernels::sgd_step(ctx(), p, gd, none, {0.5f, 0.0f, 0.0f, 0.0f, false}, true);
  const Tensor got = down(p);
  for (int64_t i = 0; i < 15; ++i) EXPECT_FLOAT_EQ(got.f32()[i], p0.f32()[i] - 0.5f * g.f32()[i]);
}

TEST_P(Sgd, ErrorsThrow) {
  Context& ctx = this->ctx();
  Tensor p = up(Tensor::zeros(Shape{10})), g = up(Tensor::zeros(Shape{11})), buf = up(Tensor::zeros(Shape{10})), none;
  EXPECT_THROW(kernels::sgd_step(ctx, p, g, buf, {}, true), Error);
  Tensor g10 = up(Tensor::zeros(Shape{10}));
  EXPECT_THROW(kernels::sgd_step(ctx, p, g10, none, {0.1f, 0.9f, 0.0f, 0.0f, false}, true), Error);  // no buffer
  EXPECT_THROW(kernels::sgd_step(ctx, p, g10, buf, {0.1f, 0.9f, 0.1f, 0.0f, true}, true), Error);  // nesterov + damp
  EXPECT_THROW(kernels::sgd_step(ctx, p, g10, buf, {0.1f, 0.0f, 0.0f, 0.0f, true}, true), Error);  // nesterov, mu 0
  EXPECT_THROW(kernels::sgd_step(ctx, p, g10, buf, {-0.1f, 0.0f, 0.0f, 0.0f, false}, true), Error);
  Tensor short_buf = up(Tensor::zeros(Shape{9}));
  EXPECT_THROW(kernels::sgd_step(ctx, p, g10, short_buf, {0.1f, 0.9f, 0.0f, 0.0f, false}, true), Error);
}

}  // namespace
}  // namespace fanout
