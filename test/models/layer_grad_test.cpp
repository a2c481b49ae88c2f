// Gradient checks of every layer through the Module interface: input and
// parameter gradients against central differences of loss = sum(r * y).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "models/layers/activation.h"
#include "models/layers/smooth_activation.h"
#include "models/layers/basic_block.h"
#include "models/layers/batchnorm.h"
#include "models/layers/conv.h"
#include "models/layers/dropout.h"
#include "models/layers/flatten.h"
#include "models/layers/groupnorm.h"
#include "models/layers/layernorm.h"
#include "models/layers/linear.h"
#include "models/layers/pooling.h"
#include "models/layers/sequential.h"
#include "runtime/nn/grad_check.h"
#include "support/test_util.h"

namespace fanout::models {
namespace {

using fanout::testing::l2_norm;
using fanout::testing::random_tensor;

// Checks d(sum(r * m(x)))/dx and /dparams for every parameter of m with
// the library's own helper (runtime/nn/grad_check.h), which users run on
// their layers; m is initialized with `seed` unless it already is.
void check_module(Module& m, const Shape& in, uint64_t seed, double tol = 1e-2, double eps = 1e-3) {
  const GradCheck c = check_gradients(m, in, seed, eps);
  ASSERT_TRUE(c.input_grad) << m.type_name() << " returned no input gradient";
  EXPECT_TRUE(c.zero_grads.empty()) << m.type_name() << ": " << c.report();
  EXPECT_LT(c.worst(), tol) << m.type_name() << ": " << c.report();
  EXPECT_EQ(c.param_errors.size(), m.named_parameters().size());
}

// The helper fails what it should: a parameter gradient off by a factor,
// an input gradient of the wrong sign, and a backward without notify_grads_ready.
class Doubling : public Module {
 public:
  Doubling(float grad_factor, float dx_sign, bool notify) : gf_(grad_factor), sign_(dx_sign), notify_(notify) {
    w_ = &register_parameter("weight", Shape{4});
  }
  void reset_parameters(std::mt19937_64&) override { w_->value.fill(0.8f); }
  Tensor forward(const Tensor& x, Context& ctx) override {
    x_ = x;
    ensure(y_, x.shape(), ctx.device());
    for (int64_t i = 0; i < x.numel(); ++i) y_.f32()[i] = 2 * x.f32()[i] * w_->value.f32()[i % 4];
    return y_;
  }
  Tensor backward(const Tensor& dy, Context& ctx) override {
    for (int64_t i = 0; i < dy.numel(); ++i) w_->grad.f32()[i % 4] += gf_ * 2 * dy.f32()[i] * x_.f32()[i];
    if (notify_) notify_grads_ready(ctx);
    for (int64_t i = 0; i < dy.numel(); ++i) dy.f32()[i] *= sign_ * 2 * w_->value.f32()[i % 4];
    return dy;
  }
  std::unique_ptr<Module> make_like() const override { return std::make_unique<Doubling>(gf_, sign_, notify_); }
  std::string type_name() const override { return "Doubling"; }

 private:
  float gf_, sign_;
  bool notify_;
  Parameter* w_;
  Tensor x_, y_;
};

TEST(LayerGrad, TheCheckFailsWrongGradients) {
  Doubling right(1, 1, true), wrong_param(1.5f, 1, true), wrong_input(1, -1, true), silent(1, 1, false);
  EXPECT_LT(check_gradients(right, Shape{3, 4}, 1).worst(), 1e-2);
  const GradCheck p = check_gradients(wrong_param, Shape{3, 4}, 1);
  EXPECT_GT(p.param_errors.at(0).second, 0.2) << p.report();
  EXPECT_LT(p.input_error, 1e-2);
  EXPECT_GT(check_gradients(wrong_input, Shape{3, 4}, 1).input_error, 1.0);
  testing::expect_user_error([&] { check_gradients(silent, Shape{3, 4}, 1); },
                             {"layer 'Doubling' (Doubling) has parameters but its backward did not call "
                              "notify_grads_ready(ctx)"});
}

TEST(LayerGrad, UsingAModuleBeforeInitSaysWhatToCall) {
  Linear l(2, 3);
  testing::expect_user_error([&] { l.to(Device::cpu()); },
                             {"Linear::to(): the module has no parameters in memory yet; call init(seed) first"});
}

TEST(LayerGrad, Linear) {
  Linear m(7, 5);
  check_module(m, Shape{3, 7}, 1);
}

TEST(LayerGrad, Conv2dStride2Pad1) {
  Conv2d m(3, 4, 3, 2, 1);
  check_module(m, Shape{2, 3, 7, 9}, 2);
}

TEST(LayerGrad, Conv2dNoBias5x5) {
  Conv2d m(2, 3, 5, 1, 2, false);
  check_module(m, Shape{2, 2, 6, 5}, 3);
}

TEST(LayerGrad, BatchNorm2dTraining) {
  BatchNorm2d m(3);
  // Non-trivial affine parameters so their gradients matter.
  m.init(4);
  check_module(m, Shape{4, 3, 3, 5}, 4);
}

TEST(LayerGrad, ReLU) {
  ReLU m;
  check_module(m, Shape{3, 4, 5}, 5);
}

TEST(LayerGrad, SmoothActivations) {
  for (kernels::Act k : {kernels::Act::Tanh, kernels::Act::Sigmoid, kernels::Act::Gelu, kernels::Act::Silu,
                         kernels::Act::LeakyRelu}) {
    SCOPED_TRACE(kernels::activation_name(k));
    SmoothActivation m(k, 0.1f);
    EXPECT_EQ(m.type_name(), kernels::activation_name(k));
    check_module(m, Shape{3, 4, 5}, 5);
  }
  testing::expect_user_error([] { SmoothActivation(kernels::Act::LeakyRelu, std::nanf("")); }, {"negative slope"});
}

TEST(LayerGrad, GroupNorm) {
  GroupNorm m(2, 6);
  m.init(3);
  m.named_parameters()[0].second->value.fill(1.3f);  // weight and bias away from 1 and 0
  m.named_parameters()[1].second->value.fill(-0.2f);
  check_module(m, Shape{3, 6, 4, 3}, 7);
  GroupNorm three_d(3, 3);
  check_module(three_d, Shape{2, 3, 2, 3, 4}, 8);
  testing::expect_user_error([] { GroupNorm(4, 6); }, {"GroupNorm(4, 6)", "split evenly"});
  GroupNorm gn(2, 6);
  gn.init(1);
  Context ctx(Device::cpu());
  testing::expect_user_error([&] { gn.forward(Tensor::zeros(Shape{2, 5, 3}), ctx); },
                             {"GroupNorm(2, 6) cannot take input of shape (2, 5, 3)"});
}

TEST(LayerGrad, InstanceNorm) {
  InstanceNorm plain(2, 3);
  plain.init(3);
  EXPECT_TRUE(plain.named_parameters().empty()) << "torch's default: affine=False";
  check_module(plain, Shape{2, 3, 4, 5}, 9);
  InstanceNorm affine(3, 4, 1e-5f, /*affine=*/true);
  affine.init(3);
  const auto ps = affine.named_parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].first, "weight");
  EXPECT_EQ(ps[1].first, "bias");
  ps[0].second->value.fill(0.7f);
  ps[1].second->value.fill(0.3f);
  check_module(affine, Shape{2, 4, 2, 3, 3}, 10);
  Context ctx(Device::cpu());
  testing::expect_user_error([&] { plain.forward(Tensor::zeros(Shape{2, 3, 5}), ctx); },
                             {"InstanceNorm2d(3) cannot take input of shape (2, 3, 5)"});
  testing::expect_user_error([] { InstanceNorm(1, 3); }, {"2 or 3 spatial dimensions"});
}

// Against torch's definition in float64: (x - mean) / sqrt(var + eps) per
// (sample, channel), biased variance, then weight and bias per channel.
TEST(LayerGrad, InstanceNormMatchesItsDefinition) {
  InstanceNorm m(2, 3, 1e-3f, /*affine=*/true);
  m.init(1);
  const auto ps = m.named_parameters();
  const float w[3] = {0.5f, -1.5f, 2.0f}, b[3] = {0.1f, 0.0f, -0.4f};
  for (int c = 0; c < 3; ++c) {
    ps[0].second->value.f32()[c] = w[c];
    ps[1].second->value.f32()[c] = b[c];
  }
  std::mt19937_64 rng(12);
  Tensor x = random_tensor(Shape{2, 3, 4, 5}, rng);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 3.0f * x.f32()[i] + 5.0f;  // away from zero mean, unit scale
  Context ctx(Device::cpu());
  const Tensor y = m.forward(x, ctx);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c) {
      const float* xs = x.f32() + (n * 3 + c) * 20;
      double mean = 0, var = 0;
      for (int k = 0; k < 20; ++k) mean += xs[k];
      mean /= 20;
      for (int k = 0; k < 20; ++k) var += (xs[k] - mean) * (xs[k] - mean);
      var /= 20;
      for (int k = 0; k < 20; ++k) {
        const double want = (xs[k] - mean) / std::sqrt(var + 1e-3) * w[c] + b[c];
        EXPECT_NEAR(y.f32()[(n * 3 + c) * 20 + k], want, 2e-6 * std::max(1.0, std::abs(want)));
      }
    }
}

TEST(LayerGrad, LayerNorm) {
  LayerNorm m(Shape{6});
  m.init(3);
  const auto ps = m.named_parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].first, "weight");
  EXPECT_EQ(ps[1].first, "bias");
  EXPECT_EQ(ps[0].second->shape, Shape{6});
  std::mt19937_64 rng(4);
  ps[0].second->value.copy_from(random_tensor(Shape{6}, rng, 0.5f, 1.5f));
  ps[1].second->value.copy_from(random_tensor(Shape{6}, rng));
  check_module(m, Shape{3, 4, 6}, 11);
  LayerNorm two(Shape{3, 4});
  two.init(3);
  check_module(two, Shape{2, 3, 4}, 12);
  LayerNorm plain(Shape{5}, 1e-5f, /*elementwise_affine=*/false);
  plain.init(3);
  EXPECT_TRUE(plain.named_parameters().empty());
  check_module(plain, Shape{4, 5}, 13);
  Context ctx(Device::cpu());
  testing::expect_user_error([&] { m.forward(Tensor::zeros(Shape{2, 5}), ctx); },
                             {"LayerNorm(6) cannot take input of shape (2, 5)"});
  testing::expect_user_error([&] { m.forward(Tensor::zeros(Shape{6}), ctx); }, {"cannot take input of shape (6)"});
  testing::expect_user_error([] { LayerNorm(Shape{}); }, {"normalized_shape"});
}

// The mask is a function of the context's key and rows, so repeated
// forwards in the gradient check draw the same one; backward multiplies by
// it. In evaluation (and at p = 0) the identity.
TEST(LayerGrad, Dropout) {
  Dropout m(0.3f);
  EXPECT_TRUE(m.named_parameters().empty());
  check_module(m, Shape{4, 3, 5}, 14);
  Context ctx(Device::cpu());
  ctx.pass_key = 77;
  std::mt19937_64 rng(15);
  Tensor x = random_tensor(Shape{64, 32}, rng, 0.5f, 1.5f);
  const Tensor y = m.forward(x, ctx).to(Device::cpu());
  int64_t zeros = 0;
  for (int64_t i = 0; i < y.numel(); ++i) zeros += y.f32()[i] == 0.0f;
  EXPECT_GT(zeros, 0.2 * y.numel());
  EXPECT_LT(zeros, 0.4 * y.numel());
  ctx.training = false;
  EXPECT_TRUE(testing::same_bits(m.forward(x, ctx).to(Device::cpu()), x)) << "evaluation: the identity";
  testing::expect_user_error([] { Dropout(1.5f); }, {"between 0 and 1"});
}

TEST(LayerGrad, AvgPool3d) {
  AvgPool3d m(3, 2, 1);
  check_module(m, Shape{2, 2, 5, 6, 7}, 16);
  AvgPool3d by_kernel(2);
  check_module(by_kernel, Shape{1, 3, 4, 4, 6}, 17);
  Context ctx(Device::cpu());
  testing::expect_user_error([&] { m.forward(Tensor::zeros(Shape{2, 3, 5, 5}), ctx); },
                             {"AvgPool3d(kernel 3, padding 1) cannot take input of shape (2, 3, 5, 5)"});
  testing::expect_user_error([] { AvgPool3d(2, 1, 2); }, {"padding must be at most half the kernel"});
}

TEST(LayerGrad, MaxPool) {
  MaxPool2d m(3, 2, 1);
  check_module(m, Shape{2, 3, 7, 6}, 6);
}

TEST(LayerGrad, AvgPool) {
  AvgPool2d m(2, 2);
  check_module(m, Shape{2, 3, 6, 5}, 7);
}

TEST(LayerGrad, AdaptiveAvgPool) {
  AdaptiveAvgPool2d m;
  check_module(m, Shape{2, 3, 5, 3}, 8);
}

TEST(LayerGrad, FlattenLinear) {
  Sequential m;
  m.add("flatten", std::make_unique<Flatten>());
  m.add("fc", std::make_unique<Linear>(2 * 3 * 4, 5));
  check_module(m, Shape{3, 2, 3, 4}, 9);
}

TEST(LayerGrad, BasicBlockWithDownsample) {
  BasicBlock m(3, 4, 2);
  check_module(m, Shape{3, 3, 6, 5}, 10, 3e-2);  // two BatchNorms deep: float noise ~1e-2
}

TEST(LayerGrad, BasicBlockIdentity) {
  BasicBlock m(4, 4, 1);
  check_module(m, Shape{3, 4, 5, 5}, 11, 3e-2);
}

TEST(LayerGrad, GradientsAccumulate) {
  Conv2d m(2, 3, 3, 1, 1);
  m.init(12);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(13);
  Tensor x = random_tensor(Shape{2, 2, 5, 5}, rng);
  Tensor y = m.forward(x, ctx);
  Tensor r = random_tensor(y.shape(), rng);
  m.zero_grad();
  m.backward(r, ctx);
  Tensor once = m.arenas().grads.to(Device::cpu());
  m.forward(x, ctx);
  m.backward(r, ctx);
  Tensor twice = m.arenas().grads;
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(twice.f32()[i], 2 * once.f32()[i], 1e-5);
}

TEST(LayerGrad, NoInputGradSkipsDx) {
  Sequential m;
  m.add("conv", std::make_unique<Conv2d>(1, 2, 3));
  m.add("relu", std::make_unique<ReLU>());
  m.init(14);
  m.set_input_grad(false);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(15);
  Tensor x = random_tensor(Shape{2, 1, 5, 5}, rng);
  Tensor y = m.forward(x, ctx);
  Tensor dx = m.backward(random_tensor(y.shape(), rng), ctx);
  EXPECT_FALSE(dx.defined());
  EXPECT_GT(l2_norm(m.arenas().grads), 0.0);
}

}  // namespace
}  // namespace fanout::models
