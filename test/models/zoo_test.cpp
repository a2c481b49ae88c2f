// Model zoo: torchvision-compatible names and shapes, accepted input shapes,
// initialization, cloning and gradient-ready notification.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "models/layers/batchnorm.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout::models {
namespace {

using fanout::testing::random_tensor;

// torchvision.models.resnet18().state_dict(), written out from its definition:
// per module its parameters then its buffers, children in definition order.
std::vector<std::pair<std::string, Shape>> torchvision_resnet18_keys(int64_t in_ch, int64_t k, int classes) {
  std::vector<std::pair<std::string, Shape>> keys;
  auto bn = [&](const std::string& p, int64_t c) {
    keys.push_back({p + ".weight", Shape{c}});
    keys.push_back({p + ".bias", Shape{c}});
    keys.push_back({p + ".running_mean", Shape{c}});
    keys.push_back({p + ".running_var", Shape{c}});
    keys.push_back({p + ".num_batches_tracked", Shape{}});
  };
  keys.push_back({"conv1.weight", Shape{64, in_ch, k, k}});
  bn("bn1", 64);
  int64_t c = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < 2; ++b) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b);
      const int64_t w = widths[l];
      const int64_t cin = b == 0 ? c : w;
      keys.push_back({p + ".conv1.weight", Shape{w, cin, 3, 3}});
      bn(p + ".bn1", w);
      keys.push_back({p + ".conv2.weight", Shape{w, w, 3, 3}});
      bn(p + ".bn2", w);
      if (b == 0 && l > 0) {
        keys.push_back({p + ".downsample.0.weight", Shape{w, cin, 1, 1}});
        bn(p + ".downsample.1", w);
      }
    }
    c = widths[l];
  }
  keys.push_back({"fc.weight", Shape{classes, 512}});
  keys.push_back({"fc.bias", Shape{classes}});
  return keys;
}

void expect_state_dict(Module& m, const std::vector<std::pair<std::string, Shape>>& want) {
  auto sd = m.state_dict();
  ASSERT_EQ(sd.size(), want.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(sd[i].first, want[i].first) << "key " << i;
    EXPECT_EQ(sd[i].second.shape(), want[i].second) << sd[i].first;
  }
}

TEST(Zoo, ResNet18ImageNetStemMatchesTorchvision) {
  auto m = make_model("resnet18:imagenet", Shape{3, 224, 224}, 1000, 0);
  expect_state_dict(*m, torchvision_resnet18_keys(3, 7, 1000));
  EXPECT_EQ(m->state_dict().size(), 122u);
  EXPECT_EQ(m->num_parameters(), 11689512);  // torchvision's resnet18 parameter count
  EXPECT_EQ(m->state_dict()[5].second.dtype(), DType::I64);  // bn1.num_batches_tracked
}

TEST(Zoo, ResNet18CifarStem) {
  auto m = make_model("resnet18", Shape{3, 32, 32}, 10, 0);
  expect_state_dict(*m, torchvision_resnet18_keys(3, 3, 10));
  EXPECT_EQ(m->num_parameters(), 11173962);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(1);
  Tensor y = m->forward(random_tensor(Shape{2, 3, 32, 32}, rng), ctx);
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
}

TEST(Zoo, LeNetTakesBothImageSizes) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(2);
  for (Shape in : {Shape{1, 28, 28}, Shape{3, 32, 32}}) {
    auto m = make_model("lenet", in, 10, 0);
    // The classic geometry: 16 * 5 * 5 features into fc1.
    bool found = false;
    for (auto& [n, p] : m->named_parameters())
      if (n == "fc1.weight") {
        EXPECT_EQ(p->shape, (Shape{120, 400}));
        found = true;
      }
    EXPECT_TRUE(found);
    Tensor y = m->forward(random_tensor(Shape{3, in[0], in[1], in[2]}, rng), ctx);
    EXPECT_EQ(y.shape(), (Shape{3, 10}));
  }
}

TEST(Zoo, RefusesShapesAndNames) {
  EXPECT_THROW(make_model("lenet", Shape{1, 12, 12}, 10, 0), Error);
  EXPECT_THROW(make_model("resnet18", Shape{3, 4, 4}, 10, 0), Error);
  // The error lists every name, gpt's spelling too.
  fanout::testing::expect_user_error([] { make_model("vgg", Shape{1, 28, 28}, 10, 0); },
                             {"unknown model 'vgg'", "heatmap3d:group", "gpt[:PRESET][,KEY=VALUE...]"});
  // A model built for one shape refuses another at forward time.
  auto m = make_model("mlp", Shape{1, 28, 28}, 10, 0);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(3);
  EXPECT_THROW(m->forward(random_tensor(Shape{2, 3, 32, 32}, rng), ctx), Error);
}

TEST(Zoo, CnnAndMlpShapes) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(4);
  for (const char* name : {"cnn", "mlp"}) {
    auto m = make_model(name, Shape{1, 28, 28}, 10, 0);
    Tensor y = m->forward(random_tensor(Shape{5, 1, 28, 28}, rng), ctx);
    EXPECT_EQ(y.shape(), (Shape{5, 10})) << name;
  }
}

TEST(Zoo, InitIsSeededAndTorchLike) {
  auto a = make_model("lenet", Shape{1, 28, 28}, 10, 7);
  auto b = make_model("lenet", Shape{1, 28, 28}, 10, 7);
  auto c = make_model("lenet", Shape{1, 28, 28}, 10, 8);
  const Tensor& pa = a->arenas().params;
  EXPECT_EQ(0, std::memcmp(pa.raw(), b->arenas().params.raw(), pa.nbytes()));
  EXPECT_NE(0, std::memcmp(pa.raw(), c->arenas().params.raw(), pa.nbytes()));
  // Linear and Conv2d default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  for (auto& [n, p] : a->named_parameters()) {
    const int64_t fan_in = p->shape.ndim == 1 ? 0 : p->shape.numel() / p->shape[0];
    if (fan_in == 0) continue;
    const float bound = 1.0f / std::sqrt(float(fan_in));
    float mx = 0;
    for (int64_t i = 0; i < p->value.numel(); ++i) mx = std::max(mx, std::abs(p->value.f32()[i]));
    EXPECT_LE(mx, bound) << n;
    EXPECT_GT(mx, 0.5f * bound) << n;
  }
}

TEST(Zoo, CloneIsDeepAndEqual) {
  auto m = make_model("cnn", Shape{1, 28, 28}, 10, 1);
  auto c = m->clone(Device::cpu());
  EXPECT_FALSE(c->arenas().params.same_storage(m->arenas().params));
  Context ctx(Device::cpu());
  std::mt19937_64 rng(5);
  Tensor x = random_tensor(Shape{4, 1, 28, 28}, rng);
  m->eval();
  c->eval();
  Tensor ya = m->forward(x, ctx).to(Device::cpu());
  Tensor yb = c->forward(x, ctx);
  EXPECT_EQ(0, std::memcmp(ya.raw(), yb.raw(), ya.nbytes()));
  c->arenas().params.fill(0.0f);
  EXPECT_GT(fanout::testing::l2_norm(m->arenas().params), 0.0);
}

TEST(Zoo, GradReadyCoversArenaOnceInReverseOrder) {
  auto m = make_model("resnet18", Shape{3, 8, 8}, 10, 2);
  Context ctx(Device::cpu());
  std::vector<std::pair<size_t, size_t>> ranges;
  ctx.on_grad_ready = [&](size_t b, size_t n) { ranges.emplace_back(b, n); };
  std::mt19937_64 rng(6);
  Tensor y = m->forward(random_tensor(Shape{2, 3, 8, 8}, rng), ctx);
  m->backward(random_tensor(y.shape(), rng), ctx);
  // Every parameter is covered exactly once.
  std::map<size_t, int> covered;
  for (auto& [b, n] : ranges)
    for (size_t i = b; i < b + n; ++i) covered[i]++;
  for (auto& [name, p] : m->named_parameters())
    for (int64_t i = 0; i < p->shape.numel(); ++i) EXPECT_EQ(covered[p->offset + i], 1) << name;
  // fc is reported first, conv1 last.
  ASSERT_FALSE(ranges.empty());
  EXPECT_GT(ranges.front().first, ranges.back().first);
  EXPECT_EQ(ranges.back().first, 0u);
}

// Without an input gradient, the layers before the first one with
// parameters compute none: mlp's fc1 (after Flatten) skips its dx, and the
// parameter gradients are the same bits.
TEST(Zoo, NoInputGradientSkipsItUpToTheFirstLayerWithParameters) {
  std::mt19937_64 rng(8);
  const Tensor x = random_tensor(Shape{6, 1, 5, 5}, rng);
  Tensor dy;
  auto grads = [&](bool input_grad, bool* returned_dx) {
    auto m = make_model("mlp", Shape{1, 5, 5}, 10, 3);
    m->set_input_grad(input_grad);
    Context ctx(Device::cpu());
    Tensor y = m->forward(x, ctx);
    if (!dy.defined()) dy = random_tensor(y.shape(), rng);
    Tensor g = testing::clone(dy);
    *returned_dx = Module::backward_of(*m, "mlp", g, ctx).defined();
    for (auto& [name, mod] : m->named_modules())
      if (name == "fc1") EXPECT_EQ(mod->input_grad(), input_grad);
    return m->arenas().grads.to(Device::cpu());
  };
  bool with_dx = false, without_dx = true;
  const Tensor a = grads(true, &with_dx), b = grads(false, &without_dx);
  EXPECT_TRUE(with_dx);
  EXPECT_FALSE(without_dx);
  EXPECT_TRUE(testing::same_bits(a, b));
  EXPECT_GT(testing::l2_norm(a), 0.0);
}

TEST(BatchNormSemantics, TrainEvalAndRunningStats) {
  BatchNorm2d bn(3, 1e-5f, 0.1f);
  bn.init(0);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(7);
  Tensor x = random_tensor(Shape{4, 3, 5, 2}, rng, 1.0f, 3.0f);
  // Per-channel batch mean and variances computed here.
  const int64_t per = 4 * 5 * 2;
  std::vector<double> mean(3, 0), var(3, 0);
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 10; ++i) mean[c] += x.f32()[(n * 3 + c) * 10 + i] / per;
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 10; ++i) {
        double d = x.f32()[(n * 3 + c) * 10 + i] - mean[c];
        var[c] += d * d / per;
      }
  Tensor y = bn.forward(x, ctx);
  for (int64_t c = 0; c < 3; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 10; ++i) m += y.f32()[(n * 3 + c) * 10 + i] / per;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t i = 0; i < 10; ++i) v += std::pow(y.f32()[(n * 3 + c) * 10 + i] - m, 2) / per;
    EXPECT_NEAR(m, 0.0, 1e-5);
    EXPECT_NEAR(v, var[c] / (var[c] + 1e-5), 1e-4);
    // running = 0.9 * init + 0.1 * batch, with the unbiased variance.
    EXPECT_NEAR(bn.running_mean().value.f32()[c], 0.1 * mean[c], 1e-5);
    EXPECT_NEAR(bn.running_var().value.f32()[c], 0.9 + 0.1 * var[c] * per / (per - 1), 1e-5);
  }
  EXPECT_EQ(bn.num_batches_tracked(), 1);
  // Eval: normalizes with the running statistics and leaves them alone.
  bn.eval();
  Tensor ye = bn.forward(x, ctx);
  for (int64_t c = 0; c < 3; ++c) {
    const float rm = bn.running_mean().value.f32()[c], rv = bn.running_var().value.f32()[c];
    const float xv = x.f32()[c * 10 + 3];
    EXPECT_NEAR(ye.f32()[c * 10 + 3], (xv - rm) / std::sqrt(rv + 1e-5f), 1e-5);
  }
  EXPECT_EQ(bn.num_batches_tracked(), 1);
}

}  // namespace
}  // namespace fanout::models
