// Optimizers over a model's arenas: parameter groups by name (weight decay
// and learning-rate scale each) against torch's update rules in float64 per
// parameter; clipping by norm and by value against a float64 norm (zero,
// huge and non-finite gradients); float64 gradients; one-line errors for
// what torch refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/optimizer.h"
#include "support/test_util.h"

namespace fanout {
namespace {

using optim::OptimizerKind;

std::unique_ptr<Module> lenet(uint64_t seed = 3) { return models::make_model("lenet", Shape{1, 28, 28}, 10, seed); }

void fill_grads(Module& m, std::mt19937_64& rng, double scale = 1e-2) {
  std::normal_distribution<double> nd;
  Tensor& g = m.arenas().grads;
  for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = static_cast<float>(nd(rng) * scale);
}

TEST(Optimizer, NoDecayGroupHoldsBiasesAndOneDimensionalParameters) {
  auto m = models::make_model("resnet18", Shape{3, 32, 32}, 10, 1);
  const std::vector<std::string> nd = optim::no_decay_params(*m);
  const std::set<std::string> got(nd.begin(), nd.end());
  for (const char* name : {"bn1.weight", "bn1.bias", "layer1.0.bn2.weight", "fc.bias"}) EXPECT_TRUE(got.count(name)) << name;
  for (const char* name : {"conv1.weight", "layer1.0.conv1.weight", "fc.weight"}) EXPECT_FALSE(got.count(name)) << name;
  for (auto& [n, p] : m->named_parameters())
    EXPECT_EQ(got.count(n) == 1, p->shape.ndim <= 1) << n;

  Context ctx(Device::cpu());
  optim::OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.weight_decay = 0.05f;
  o.no_decay_norm_bias = true;
  auto opt = optim::make_optimizer(*m, ctx, o);
  ASSERT_EQ(opt->groups().size(), 2u);
  EXPECT_EQ(opt->groups()[0].name, "default");
  EXPECT_EQ(opt->groups()[0].weight_decay, 0.05f);
  EXPECT_EQ(opt->groups()[1].name, "no_decay");
  EXPECT_EQ(opt->groups()[1].weight_decay, 0.0f);
  EXPECT_EQ(opt->groups()[1].params, nd);
  EXPECT_EQ(opt->groups()[0].params.size() + nd.size(), m->named_parameters().size());
}

// With explicit groups, no_decay_norm_bias groups the biases and 1-D
// parameters no explicit group names; a group of the user's named
// "no_decay" is refused.
TEST(Optimizer, NoDecayGroupTakesWhatExplicitGroupsLeave) {
  auto m = lenet();
  Context ctx(Device::cpu());
  optim::OptimizerOptions o;
  o.weight_decay = 0.1f;
  o.no_decay_norm_bias = true;
  auto opt = optim::make_optimizer(*m, ctx, o, {{"g", {"fc1.weight", "fc1.bias"}, 0.5f, 2.0f}});
  std::map<std::string, std::pair<std::string, float>> group_of;  // parameter -> (group, weight decay)
  for (const optim::ParamGroup& g : opt->groups())
    for (const std::string& n : g.params) group_of[n] = {g.name, g.weight_decay};
  ASSERT_EQ(group_of.size(), m->named_parameters().size());
  for (auto& [n, p] : m->named_parameters()) {
    const bool explicit_group = n.rfind("fc1.", 0) == 0;
    const std::string want = explicit_group ? "g" : p->shape.ndim <= 1 ? "no_decay" : "default";
    EXPECT_EQ(group_of[n].first, want) << n;
    EXPECT_EQ(group_of[n].second, explicit_group ? 0.5f : p->shape.ndim <= 1 ? 0.0f : 0.1f) << n;
  }
  testing::expect_user_error([&] { optim::make_optimizer(*m, ctx, o, {{"no_decay", {"fc1.bias"}, 0, 1}}); },
                             {"parameter group 'no_decay' is the one no_decay_norm_bias makes"});
}

// An optimizer that outlives the context it was made with (its engine's)
// refuses to step instead of reading freed memory.
TEST(Optimizer, OutlivingItsContextIsAnError) {
  auto m = lenet();
  std::unique_ptr<optim::Optimizer> opt;
  {
    Context ctx(Device::cpu());
    opt = optim::make_optimizer(*m, ctx, {});
    opt->zero_grad();
    opt->step();
  }
  for (auto call : {+[](optim::Optimizer& o) { o.step(); }, +[](optim::Optimizer& o) { o.zero_grad(); },
                    +[](optim::Optimizer& o) { o.grad_sum_squares(); }})
    testing::expect_user_error([&] { call(*opt); }, {"the optimizer's context is gone", "must not outlive the engine"});
}

// Several groups with their own weight decay and learning-rate scale, 6
// steps, every optimizer: each parameter follows torch's rule with its
// group's settings (float64 reference), within 1e-6 relative.
struct GroupCase {
  const char* name;
  OptimizerKind kind;
  bool amsgrad;
};

class Groups : public ::testing::TestWithParam<GroupCase> {};
INSTANTIATE_TEST_SUITE_P(Optimizers, Groups,
                         ::testing::Values(GroupCase{"sgd", OptimizerKind::SGD, false},
                                           GroupCase{"adam", OptimizerKind::Adam, false},
                                           GroupCase{"adamw", OptimizerKind::AdamW, false},
                                           GroupCase{"adamw_amsgrad", OptimizerKind::AdamW, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_P(Groups, EveryParameterFollowsItsGroup) {
  const GroupCase c = GetParam();
  auto m = lenet();
  Context ctx(Device::cpu());
  optim::OptimizerOptions o;
  o.kind = c.kind;
  o.lr = c.kind == OptimizerKind::SGD ? 0.05f : 3e-3f;
  o.weight_decay = 1e-2f;
  o.momentum = c.kind == OptimizerKind::SGD ? 0.9f : 0.0f;
  o.beta1 = 0.85f;
  o.beta2 = 0.99f;
  o.eps = 1e-7f;
  o.amsgrad = c.amsgrad;
  // conv weights: their own decay and half the rate; biases: no decay; the rest: default.
  std::vector<optim::ParamGroup> groups = {{"conv", {"conv1.weight", "conv2.weight"}, 0.1f, 0.5f},
                                           {"bias", {}, 0.0f, 2.0f}};
  for (auto& [n, p] : m->named_parameters())
    if (n.size() > 5 && n.substr(n.size() - 5) == ".bias") groups[1].params.push_back(n);
  auto opt = optim::make_optimizer(*m, ctx, o, groups);
  ASSERT_EQ(opt->groups().size(), 3u);
  std::map<std::string, std::pair<double, double>> settings;  // name -> (weight decay, lr scale)
  for (const auto& g : opt->groups())
    for (const auto& n : g.params) settings[n] = {g.weight_decay, g.lr_scale};

  const auto params = m->named_parameters();
  const int64_t n = m->arenas().params.numel();
  std::vector<double> p(n), s1(n, 0.0), s2(n, 0.0), s3(n, 0.0);
  for (int64_t i = 0; i < n; ++i) p[i] = m->arenas().params.f32()[i];
  std::mt19937_64 rng(17);
  for (int t = 1; t <= 6; ++t) {
    fill_grads(*m, rng);
    const Tensor g = testing::clone(m->arenas().grads);
    const float lr_now = o.lr * (1.0f - 0.1f * t);  // the schedule moves the rate
    opt->set_lr(lr_now);
    opt->step();
    opt->zero_grad();
    for (auto& [name, prm] : params) {
      const auto [wd, scale] = settings.at(name);
      const double lr = double(lr_now) * scale, b1 = o.beta1, b2 = o.beta2;
      for (int64_t i = prm->offset; i < prm->offset + prm->shape.numel(); ++i) {
        double gi = g.f32()[i];
        if (c.kind == OptimizerKind::SGD) {
          gi += wd * p[i];
          s1[i] = t == 1 ? gi : double(o.momentum) * s1[i] + gi;
          p[i] -= lr * s1[i];
          continue;
        }
        if (c.kind == OptimizerKind::AdamW) p[i] *= 1 - lr * wd;
        else gi += wd * p[i];
        s1[i] = b1 * s1[i] + (1 - b1) * gi;
        s2[i] = b2 * s2[i] + (1 - b2) * gi * gi;
        s3[i] = std::max(s3[i], s2[i]);
        const double denom = std::sqrt(c.amsgrad ? s3[i] : s2[i]) / std::sqrt(1 - std::pow(b2, t)) + double(o.eps);
        p[i] -= lr / (1 - std::pow(b1, t)) * s1[i] / denom;
      }
    }
    for (auto& [name, prm] : params)
      for (int64_t i = prm->offset; i < prm->offset + prm->shape.numel(); ++i)
        ASSERT_NEAR(m->arenas().params.f32()[i], p[i], 1e-6 * (std::abs(p[i]) + 1e-2)) << name << " step " << t;
  }
  EXPECT_EQ(opt->steps(), 6);
  const auto state = opt->state();
  ASSERT_EQ(state.size(), c.kind == OptimizerKind::SGD ? 1u : (c.amsgrad ? 3u : 2u));
  EXPECT_EQ(state[0].first, c.kind == OptimizerKind::SGD ? "momentum_buffer" : "exp_avg");
  for (auto& [name, prm] : params)
    for (int64_t i = prm->offset; i < prm->offset + prm->shape.numel(); ++i)
      ASSERT_NEAR(state[0].second->f32()[i], s1[i], 1e-6 * (std::abs(s1[i]) + 1e-2)) << name;
  // Gradients are zero after zero_grad.
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m->arenas().grads.f32()[i], 0.0f);
}

double norm64(const Tensor& g) {
  double s = 0;
  for (int64_t i = 0; i < g.numel(); ++i) s += double(g.f32()[i]) * g.f32()[i];
  return std::sqrt(s);
}

TEST(ClipGradNorm, CoefficientAgainstAFloat64Norm) {
  auto m = lenet();
  Context ctx(Device::cpu());
  auto opt = optim::make_optimizer(*m, ctx, {});
  std::mt19937_64 rng(5);
  for (double scale : {1e-4, 1e-2, 1.0, 1e30}) {
    SCOPED_TRACE(scale);
    fill_grads(*m, rng, scale);
    const Tensor before = testing::clone(m->arenas().grads);
    const double want = norm64(before);
    for (double max_norm : {0.5, 1.0, 1e40}) {
      m->arenas().grads.copy_from(before);
      const double got = optim::clip_grad_norm(*opt, max_norm);
      EXPECT_NEAR(got, want, 1e-12 * want);
      const double coef = std::min(1.0, max_norm / (want + 1e-6));
      EXPECT_EQ(optim::clip_coefficient(want, max_norm), coef);
      const Tensor& after = m->arenas().grads;
      for (int64_t i = 0; i < after.numel(); ++i)
        ASSERT_NEAR(after.f32()[i], before.f32()[i] * coef, 1e-6 * std::abs(before.f32()[i] * coef)) << i;
      if (coef < 1) EXPECT_NEAR(norm64(after), max_norm, 1e-5 * max_norm);
      else EXPECT_TRUE(testing::same_bits(after, before)) << "a coefficient of 1 changes nothing";
    }
  }
  // Zero gradients: norm 0, nothing changes (torch: max_norm / 1e-6, clamped to 1).
  m->arenas().grads.zero();
  EXPECT_EQ(optim::clip_grad_norm(*opt, 1.0), 0.0);
  EXPECT_EQ(norm64(m->arenas().grads), 0.0);
  // max_norm 0 clips every gradient to zero, as torch does.
  fill_grads(*m, rng);
  EXPECT_GT(optim::clip_grad_norm(*opt, 0.0), 0.0);
  EXPECT_EQ(norm64(m->arenas().grads), 0.0);
  // Non-finite gradients: the norm says so and the gradients are left alone.
  fill_grads(*m, rng);
  m->arenas().grads.f32()[7] = std::numeric_limits<float>::infinity();
  const Tensor inf_grads = testing::clone(m->arenas().grads);
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm(*opt, 1.0)));
  EXPECT_TRUE(testing::same_bits(m->arenas().grads, inf_grads));
  m->arenas().grads.f32()[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(optim::clip_grad_norm(*opt, 1.0)));
  testing::expect_user_error([&] { optim::clip_grad_norm(*opt, -1.0); }, {"invalid max norm"});
}

TEST(ClipGradValue, ClampsEveryElement) {
  auto m = lenet();
  Context ctx(Device::cpu());
  auto opt = optim::make_optimizer(*m, ctx, {});
  std::mt19937_64 rng(6);
  fill_grads(*m, rng, 1.0);
  const Tensor before = testing::clone(m->arenas().grads);
  optim::clip_grad_value(*opt, 0.5f);
  int64_t clipped = 0;
  for (int64_t i = 0; i < before.numel(); ++i) {
    const float b = before.f32()[i];
    ASSERT_EQ(m->arenas().grads.f32()[i], std::max(-0.5f, std::min(0.5f, b))) << i;
    clipped += std::abs(b) > 0.5f;
  }
  EXPECT_GT(clipped, 0);
  testing::expect_user_error([&] { optim::clip_grad_value(*opt, -0.1f); }, {"invalid clip value"});
}

// float64 gradients (split-invariant): clipping and the step see them rounded to float once.
TEST(ClipGradNorm, Float64GradientsAreRoundedOnce) {
  auto a = lenet(), b = lenet();
  a->set_grad_dtype(DType::F64);
  Context ctx(Device::cpu());
  optim::OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 1e-3f;
  auto oa = optim::make_optimizer(*a, ctx, o), ob = optim::make_optimizer(*b, ctx, o);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd;
  for (int step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < a->arenas().grads.numel(); ++i) {
      a->arenas().grads.f64()[i] = nd(rng);
      b->arenas().grads.f32()[i] = static_cast<float>(a->arenas().grads.f64()[i]);
    }
    EXPECT_EQ(optim::clip_grad_norm(*oa, 1.0), optim::clip_grad_norm(*ob, 1.0));
    oa->step();
    ob->step();
    oa->zero_grad();
    ob->zero_grad();
  }
  EXPECT_TRUE(testing::same_bits(a->arenas().params, b->arenas().params));
}

// Every kind the table names is built by its flag name, steps, and reports
// torch's class name; a kind outside the table is one line, never a
// silently different optimizer.
TEST(Optimizer, EveryKindByName) {
  const std::vector<std::string> names = optim::optimizer_names();
  EXPECT_EQ(names, (std::vector<std::string>{"sgd", "adam", "adamw"}));
  const std::map<std::string, std::string> torch = {{"sgd", "SGD"}, {"adam", "Adam"}, {"adamw", "AdamW"}};
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    auto m = lenet();
    Context ctx(Device::cpu());
    optim::OptimizerOptions o;
    o.kind = optim::parse_optimizer(n);
    o.lr = 1e-2f;
    o.momentum = n == "sgd" ? 0.9 : 0.0;
    auto opt = optim::make_optimizer(*m, ctx, o);
    EXPECT_EQ(std::string(opt->type()), torch.at(n));
    EXPECT_EQ(opt->kind(), o.kind);
    std::mt19937_64 rng(7);
    m->arenas().grads.copy_from(testing::random_tensor(m->arenas().grads.shape(), rng));
    const Tensor before = m->arenas().params.to(Device::cpu());
    opt->step();
    EXPECT_FALSE(testing::same_bits(before, m->arenas().params));  // it stepped
    std::vector<std::string> want = n == "sgd" ? std::vector<std::string>{"momentum_buffer"}
                                               : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
    EXPECT_EQ(opt->state_names(), want);
  }
  auto m = lenet();
  Context ctx(Device::cpu());
  optim::OptimizerOptions o;
  o.kind = static_cast<OptimizerKind>(42);
  testing::expect_user_error([&] { optim::make_optimizer(*m, ctx, o); }, {"optimizer kind 42", "not in the optimizer table"});
}

TEST(Optimizer, RefusesWhatTorchRefuses) {
  auto m = lenet();
  Context ctx(Device::cpu());
  auto make = [&](auto edit) {
    optim::OptimizerOptions o;
    edit(o);
    return [&m, &ctx, o] { optim::make_optimizer(*m, ctx, o); };
  };
  using O = optim::OptimizerOptions;
  testing::expect_user_error(make([](O& o) { o.lr = -1e-3f; }), {"invalid learning rate"});
  testing::expect_user_error(make([](O& o) { o.weight_decay = -1; }), {"invalid weight decay"});
  testing::expect_user_error(make([](O& o) { o.momentum = -0.1f; }), {"invalid momentum"});
  testing::expect_user_error(make([](O& o) { o.nesterov = true; }), {"Nesterov"});
  testing::expect_user_error(make([](O& o) { o.amsgrad = true; }), {"amsgrad", "not SGD"});
  testing::expect_user_error(make([](O& o) { o.kind = OptimizerKind::AdamW; o.eps = -1e-8f; }), {"invalid epsilon"});
  testing::expect_user_error(make([](O& o) { o.kind = OptimizerKind::Adam; o.beta1 = 1.0f; }), {"invalid beta1"});
  testing::expect_user_error(make([](O& o) { o.kind = OptimizerKind::Adam; o.beta2 = -0.1f; }), {"invalid beta2"});
  testing::expect_user_error(make([](O& o) { o.kind = OptimizerKind::AdamW; o.nesterov = true; }),
                             {"Nesterov", "not AdamW"});
  testing::expect_user_error([] { optim::parse_optimizer("lamb"); }, {"unknown optimizer 'lamb'", "sgd, adam or adamw"});
  testing::expect_user_error([&] { optim::make_optimizer(*m, ctx, {}, {{"g", {"conv9.weight"}, 0, 1}}); },
                             {"conv9.weight", "does not have"});
  testing::expect_user_error(
      [&] { optim::make_optimizer(*m, ctx, {}, {{"a", {"fc1.bias"}, 0, 1}, {"b", {"fc1.bias"}, 0, 1}}); },
      {"fc1.bias", "two parameter groups"});
  // Group names are unique, and "default" is the name of the parameters no group lists.
  testing::expect_user_error(
      [&] { optim::make_optimizer(*m, ctx, {}, {{"a", {"fc1.bias"}, 0, 1}, {"a", {"fc2.bias"}, 0, 1}}); },
      {"two parameter groups are named 'a'"});
  testing::expect_user_error([&] { optim::make_optimizer(*m, ctx, {}, {{"default", {"fc1.bias"}, 0.5, 2}}); },
                             {"parameter group 'default' leaves parameters out"});
  std::vector<optim::ParamGroup> every{{"default", {}, 0.5, 2}};
  for (auto& [n, p] : m->named_parameters()) every[0].params.push_back(n);
  EXPECT_EQ(optim::make_optimizer(*m, ctx, {}, every)->groups().size(), 1u) << "a 'default' naming every parameter";
  auto opt = optim::make_optimizer(*m, ctx, {});
  testing::expect_user_error([&] { opt->set_lr(std::nanf("")); }, {"invalid learning rate"});
}

}  // namespace
}  // namespace fanout
