// Loss scaler, GradScaler's rules: finite gradients are unscaled by the
// float reciprocal and stepped; a step with inf or NaN is skipped (parameters
// and optimizer state untouched), the scale halves; the scale doubles after
// growth_interval finite steps and never grows to infinity; the state round
// trips; bad options are one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/optim/grad_scaler.h"
#include "support/test_util.h"

namespace fanout {
namespace {

struct Rig {
  std::unique_ptr<Module> model = models::make_model("lenet", Shape{1, 28, 28}, 10, 2);
  Context ctx{Device::cpu()};
  std::unique_ptr<optim::Optimizer> opt;
  std::mt19937_64 rng{3};
  Rig() {
    optim::OptimizerOptions o;
    o.kind = optim::OptimizerKind::AdamW;
    o.lr = 1e-3f;
    opt = optim::make_optimizer(*model, ctx, o);
  }
  // Gradients as a scaled loss gives them: `scale` times values of about 1e-3.
  Tensor fill(float scale) {
    std::normal_distribution<float> nd(0.0f, 1e-3f);
    Tensor& g = model->arenas().grads;
    for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = nd(rng) * scale;
    return testing::clone(g);
  }
};

TEST(GradScaler, FiniteStepsUnscaleStepAndGrow) {
  Rig s;
  optim::GradScalerOptions o;
  o.growth_interval = 3;
  optim::GradScaler scaler(o);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  for (int step = 1; step <= 7; ++step) {
    const float scale = scaler.scale();
    const Tensor scaled = s.fill(scale);
    ASSERT_TRUE(scaler.unscale(*s.opt));
    const float inv = static_cast<float>(1.0 / static_cast<double>(scale));
    const Tensor& g = s.model->arenas().grads;
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.f32()[i], scaled.f32()[i] * inv) << i;
    const Tensor before = testing::clone(s.model->arenas().params);
    EXPECT_TRUE(scaler.step(*s.opt));
    EXPECT_FALSE(testing::same_bits(s.model->arenas().params, before)) << "stepped";
    s.opt->zero_grad();
    // Growth after 3 finite steps in a row: steps 3 and 6.
    EXPECT_EQ(scaler.scale(), 65536.0f * (step >= 6 ? 4.0f : step >= 3 ? 2.0f : 1.0f)) << "step " << step;
    EXPECT_EQ(scaler.growth_tracker(), step % 3);
  }
  EXPECT_EQ(s.opt->steps(), 7);
  EXPECT_EQ(scaler.skipped(), 0);
}

TEST(GradScaler, NonFiniteStepIsSkippedAndTheScaleBacksOff) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(bad);
    Rig s;
    optim::GradScaler scaler;
    s.fill(scaler.scale());
    EXPECT_TRUE(scaler.step(*s.opt));  // a finite step first: the optimizer has state
    s.opt->zero_grad();
    const Tensor params = testing::clone(s.model->arenas().params);
    std::vector<Tensor> state;
    for (auto& [n, t] : s.opt->state()) state.push_back(testing::clone(*t));
    s.fill(scaler.scale());
    s.model->arenas().grads.f32()[1234] = bad;  // one overflowed element
    EXPECT_FALSE(scaler.step(*s.opt));          // unscale runs inside step
    EXPECT_TRUE(testing::same_bits(s.model->arenas().params, params)) << "parameters untouched";
    size_t i = 0;
    for (auto& [n, t] : s.opt->state()) EXPECT_TRUE(testing::same_bits(*t, state[i++])) << n << " untouched";
    EXPECT_EQ(s.opt->steps(), 1);
    EXPECT_EQ(scaler.scale(), 32768.0f);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    EXPECT_EQ(scaler.skipped(), 1);
    s.opt->zero_grad();
    s.fill(scaler.scale());
    EXPECT_TRUE(scaler.step(*s.opt));  // and the next finite step goes on
    EXPECT_EQ(scaler.growth_tracker(), 1);
  }
}

TEST(GradScaler, NeverGrowsToInfinityAndStateRoundTrips) {
  Rig s;
  optim::GradScalerOptions o;
  o.init_scale = 3e38f;
  o.growth_interval = 1;
  optim::GradScaler scaler(o);
  s.fill(1.0f);
  EXPECT_TRUE(scaler.step(*s.opt));
  EXPECT_EQ(scaler.scale(), 3e38f) << "growing would overflow: kept";
  EXPECT_EQ(scaler.growth_tracker(), 0);

  optim::GradScaler a, b;
  s.opt->zero_grad();
  s.fill(a.scale());
  s.model->arenas().grads.f32()[0] = std::numeric_limits<float>::infinity();
  a.step(*s.opt);
  s.opt->zero_grad();
  s.fill(a.scale());
  a.step(*s.opt);
  b.load_state(a.state());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped(), 1);
  EXPECT_EQ(b.state(), a.state());
  testing::expect_user_error([&] { b.load_state({{"scale", -1.0}, {"growth_tracker", 0}, {"skipped", 0}}); },
                             {"out of range"});
  testing::expect_user_error([&] { b.load_state({{"scale", 1.0}}); }, {"malformed"});
  testing::expect_user_error([&] { b.load_state({{"scale", 1.0}, {"growth_tracker", 0}, {"skipped", -5}}); },
                             {"out of range"});
}

TEST(GradScaler, RefusesWhatTorchRefuses) {
  auto make = [](auto edit) {
    optim::GradScalerOptions o;
    edit(o);
    return [o] { optim::GradScaler s(o); };
  };
  using O = optim::GradScalerOptions;
  testing::expect_user_error(make([](O& o) { o.init_scale = 0; }), {"initial loss scale"});
  testing::expect_user_error(make([](O& o) { o.growth_factor = 1.0f; }), {"growth factor"});
  testing::expect_user_error(make([](O& o) { o.backoff_factor = 1.0f; }), {"backoff factor"});
  testing::expect_user_error(make([](O& o) { o.growth_interval = 0; }), {"growth interval"});
  Rig s;
  optim::GradScaler scaler;
  s.fill(1.0f);
  scaler.unscale(*s.opt);
  EXPECT_THROW(scaler.unscale(*s.opt), Error) << "twice in one step";
}

}  // namespace
}  // namespace fanout
