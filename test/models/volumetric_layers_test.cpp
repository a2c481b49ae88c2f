// Volumetric layers (Conv3d, BatchNorm3d, MaxPool3d, Upsample3d): parameter
// and buffer names and shapes as torch's, initialization bounds, BatchNorm3d's
// batch and running statistics over N*D*H*W values per channel (momentum,
// unbiased variance) and eval mode against float64 references on every
// backend, gradients by central differences through the Module interface,
// a small 3-D heatmap network on every backend against the CPU, no
// allocation after warm-up, and one-line errors for bad shapes.
#include <gtest/gtest.h>

#include "kernels/cpu/plan_count.h"
#include "runtime/nn/grad_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "models/layers/activation.h"
#include "models/layers/batchnorm.h"
#include "models/layers/conv.h"
#include "models/layers/pooling.h"
#include "models/layers/upsample.h"
#include "models/layers/sequential.h"
#include "runtime/core/error.h"
#include "runtime/core/memory.h"
#include "support/test_util.h"

namespace fanout::models {
namespace {

namespace ft = fanout::testing;

// The parameter (or buffer) `name` of m, on m's device (read it with down()
// in a backend test: CUDA work is asynchronous).
Tensor param(Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p->value;
  for (auto& [n, b] : m.named_buffers())
    if (n == name) return b->value;
  ADD_FAILURE() << "no parameter or buffer " << name;
  return Tensor();
}
// The gradient of parameter `name`, on m's device.
Tensor grad(Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return m.arenas().grads.flat(p->offset, p->shape);
  ADD_FAILURE() << "no parameter " << name;
  return Tensor();
}
// Sets parameter or float buffer `name` from a host tensor.
void set(Module& m, const std::string& name, const Tensor& host) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p->value.copy_from(host);
  for (auto& [n, b] : m.named_buffers())
    if (n == name) return b->value.copy_from(host);
  ADD_FAILURE() << "no parameter or buffer " << name;
}

// ---- names, shapes, initialization ----

TEST(VolumetricLayers, Conv3dParametersAreTorchs) {
  Conv3d m(3, 5, 3, 2, 1);
  m.init(1);
  EXPECT_EQ(m.type_name(), "Conv3d");
  auto ps = m.named_parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].first, "weight");
  EXPECT_EQ(ps[0].second->shape, (Shape{5, 3, 3, 3, 3}));
  EXPECT_EQ(ps[1].first, "bias");
  EXPECT_EQ(ps[1].second->shape, (Shape{5}));
  EXPECT_TRUE(m.named_buffers().empty());
  // kaiming_uniform(a = sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 3 * 27, for weight and bias.
  const float bound = 1.0f / std::sqrt(81.0f);
  for (const char* name : {"weight", "bias"}) {
    const Tensor t = param(m, name);
    float lo = 0, hi = 0;
    double mean = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      lo = std::min(lo, t.f32()[i]);
      hi = std::max(hi, t.f32()[i]);
      mean += t.f32()[i];
    }
    mean /= static_cast<double>(t.numel());
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LE(hi, bound) << name;
    EXPECT_GT(ft::l2_norm(t), 0.0) << name;
    if (t.numel() > 100) {  // 405 weights: the range is nearly filled and the mean near 0
      EXPECT_LT(lo, -0.9f * bound) << name;
      EXPECT_GT(hi, 0.9f * bound) << name;
      EXPECT_LT(std::abs(mean), 0.1 * bound) << name;
    }
  }
  Conv3d nb(2, 4, 1, 1, 0, /*bias=*/false);
  ASSERT_EQ(nb.named_parameters().size(), 1u);
  EXPECT_EQ(nb.named_parameters()[0].second->shape, (Shape{4, 2, 1, 1, 1}));
  EXPECT_EQ(nb.bias(), nullptr);
  auto like = m.make_like();
  EXPECT_EQ(like->type_name(), "Conv3d");
  like->init(1);
  EXPECT_TRUE(ft::same_bits(param(*like, "weight"), param(m, "weight")));  // same seed, same values
}

TEST(VolumetricLayers, Conv3dKaimingNormalFanOut) {
  Conv3d m(4, 16, 3, 1, 1, false, Conv3d::Init::KaimingNormalFanOut);
  m.init(2);
  const Tensor w = param(m, "weight");
  double ss = 0;
  for (int64_t i = 0; i < w.numel(); ++i) ss += double(w.f32()[i]) * w.f32()[i];
  const double want = 2.0 / (16 * 27);  // N(0, 2 / fan_out)
  EXPECT_NEAR(ss / static_cast<double>(w.numel()), want, 0.15 * want);
}

TEST(VolumetricLayers, BatchNorm3dParametersAndBuffersAreTorchs) {
  BatchNorm3d m(6);
  m.init(3);
  EXPECT_EQ(m.type_name(), "BatchNorm3d");
  auto ps = m.named_parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].first, "weight");
  EXPECT_EQ(ps[1].first, "bias");
  for (auto& [n, p] : ps) EXPECT_EQ(p->shape, (Shape{6})) << n;
  auto bs = m.named_buffers();
  ASSERT_EQ(bs.size(), 3u);
  EXPECT_EQ(bs[0].first, "running_mean");
  EXPECT_EQ(bs[1].first, "running_var");
  EXPECT_EQ(bs[2].first, "num_batches_tracked");
  EXPECT_EQ(bs[0].second->shape, (Shape{6}));
  EXPECT_EQ(bs[1].second->shape, (Shape{6}));
  EXPECT_EQ(bs[2].second->shape, (Shape{}));
  EXPECT_EQ(bs[2].second->dtype, DType::I64);
  for (int64_t c = 0; c < 6; ++c) {
    EXPECT_EQ(param(m, "weight").f32()[c], 1.0f);
    EXPECT_EQ(param(m, "bias").f32()[c], 0.0f);
    EXPECT_EQ(param(m, "running_mean").f32()[c], 0.0f);
    EXPECT_EQ(param(m, "running_var").f32()[c], 1.0f);
  }
  EXPECT_EQ(m.num_batches_tracked(), 0);
  auto like = m.make_like();
  EXPECT_EQ(like->type_name(), "BatchNorm3d");
  EXPECT_NE(dynamic_cast<BatchNorm3d*>(like.get()), nullptr);
  // BatchNorm2d is unchanged: its own name, the same tensors.
  BatchNorm2d b2(6);
  EXPECT_EQ(b2.type_name(), "BatchNorm2d");
  EXPECT_EQ(b2.make_like()->type_name(), "BatchNorm2d");
  EXPECT_EQ(b2.named_parameters().size(), 2u);
  EXPECT_EQ(b2.named_buffers().size(), 3u);
}

TEST(VolumetricLayers, PoolingLayersHaveNoTensors) {
  MaxPool3d p(2);
  Upsample3d u(2);
  EXPECT_EQ(p.type_name(), "MaxPool3d");
  EXPECT_EQ(u.type_name(), "Upsample3d");
  EXPECT_TRUE(p.named_parameters().empty() && p.named_buffers().empty());
  EXPECT_TRUE(u.named_parameters().empty() && u.named_buffers().empty());
  Context ctx(Device::cpu());
  std::mt19937_64 rng(4);
  Tensor x = ft::random_tensor(Shape{2, 3, 5, 7, 6}, rng);
  EXPECT_EQ(p.forward(x, ctx).shape(), (Shape{2, 3, 2, 3, 3}));  // stride defaults to the kernel, as torch's
  EXPECT_EQ(u.forward(x, ctx).shape(), (Shape{2, 3, 10, 14, 12}));
  EXPECT_EQ(MaxPool3d(3, 2, 1).forward(x, ctx).shape(), (Shape{2, 3, 3, 4, 3}));
}

// ---- BatchNorm3d statistics against float64, on every backend ----

FANOUT_BACKEND_SUITE(BatchNorm3dOnBackend);

// Per-channel mean and biased variance over (N, D, H, W) in double.
void moments(const Tensor& x, std::vector<double>& m, std::vector<double>& v) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  m.assign(c, 0.0);
  v.assign(c, 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) m[ch] += x.f32()[(i * c + ch) * s + k];
    m[ch] /= static_cast<double>(n * s);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < s; ++k) {
        const double d = x.f32()[(i * c + ch) * s + k] - m[ch];
        v[ch] += d * d;
      }
    v[ch] /= static_cast<double>(n * s);
  }
}

TEST_P(BatchNorm3dOnBackend, TrainingUsesBatchStatisticsAndUpdatesRunningOnes) {
  std::mt19937_64 rng(11);
  const Shape s{3, 4, 5, 6, 7};  // N*D*H*W = 630 values per channel
  const int64_t c = s[1], count = s.numel() / c;
  BatchNorm3d host(c, 1e-5f, 0.1f);
  host.init(0);
  Tensor gamma = ft::random_tensor(Shape{c}, rng, 0.5f, 1.5f), beta = ft::random_tensor(Shape{c}, rng);
  set(host, "weight", gamma);
  set(host, "bias", beta);
  auto bn = host.clone(dev());
  bn->train();
  std::vector<double> rm(c, 0.0), rv(c, 1.0);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const Tensor x = ft::offset_channels(s, {0.5, -2.0, 3.0, 10.0}, 1.0 + step, rng);
    const Tensor xd = up(x);
    const Tensor y = down(bn->forward(xd, ctx()));
    std::vector<double> m, v;
    moments(x, m, v);
    std::vector<double> want(x.numel());
    const int64_t sp = x.numel() / (s[0] * c);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t ch = (i / sp) % c;
      want[i] = (x.f32()[i] - m[ch]) / std::sqrt(v[ch] + 1e-5) * gamma.f32()[ch] + beta.f32()[ch];
    }
    EXPECT_TRUE(matches(y, want, 1e-5, 1e-5));
    for (int64_t ch = 0; ch < c; ++ch) {
      rm[ch] = 0.9 * rm[ch] + 0.1 * m[ch];
      rv[ch] = 0.9 * rv[ch] + 0.1 * v[ch] * count / (count - 1);  // unbiased over N*D*H*W
    }
    EXPECT_LT(ft::max_rel_diff(down(param(*bn, "running_mean")), rm), 1e-6);
    EXPECT_LT(ft::max_rel_diff(down(param(*bn, "running_var")), rv), 1e-6);
    EXPECT_EQ(dynamic_cast<BatchNormNd&>(*bn).num_batches_tracked(), step + 1);
  }
}

TEST_P(BatchNorm3dOnBackend, EvalUsesRunningStatistics) {
  std::mt19937_64 rng(12);
  const Shape s{2, 3, 4, 3, 5};
  const int64_t c = s[1];
  BatchNorm3d host(c);
  host.init(0);
  Tensor gamma = ft::random_tensor(Shape{c}, rng, 0.5f, 1.5f), beta = ft::random_tensor(Shape{c}, rng);
  Tensor rm = ft::random_tensor(Shape{c}, rng), rv = ft::random_tensor(Shape{c}, rng, 0.2f, 3.0f);
  set(host, "weight", gamma);
  set(host, "bias", beta);
  set(host, "running_mean", rm);
  set(host, "running_var", rv);
  auto bn = host.clone(dev());
  bn->eval();
  const Tensor x = ft::random_tensor(s, rng, -2.0f, 2.0f);
  const Tensor xd = up(x);
  const Tensor y = down(bn->forward(xd, ctx()));
  std::vector<double> want(x.numel());
  const int64_t sp = x.numel() / (s[0] * c);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t ch = (i / sp) % c;
    want[i] = (x.f32()[i] - rm.f32()[ch]) / std::sqrt(double(rv.f32()[ch]) + 1e-5) * gamma.f32()[ch] + beta.f32()[ch];
  }
  EXPECT_TRUE(matches(y, want, 1e-5, 1e-5));
  EXPECT_TRUE(ft::same_bits(down(param(*bn, "running_mean")), rm));  // eval leaves the statistics alone
  EXPECT_TRUE(ft::same_bits(down(param(*bn, "running_var")), rv));
  EXPECT_EQ(dynamic_cast<BatchNormNd&>(*bn).num_batches_tracked(), 0);
}

TEST_P(BatchNorm3dOnBackend, GradientsByCentralDifferences) {
  std::mt19937_64 rng(13);
  const Shape s{2, 3, 3, 4, 5};
  BatchNorm3d host(3);
  host.init(0);
  Tensor gamma = ft::random_tensor(Shape{3}, rng, 0.5f, 1.5f), beta = ft::random_tensor(Shape{3}, rng);
  set(host, "weight", gamma);
  set(host, "bias", beta);
  auto bn = host.clone(dev());
  Tensor x = ft::random_tensor(s, rng);
  Tensor r = ft::random_tensor(s, rng);
  auto loss = [&] {  // <r, y>, accumulated in float64
    set(*bn, "weight", gamma);
    set(*bn, "bias", beta);
    Tensor xe = up(x);
    return ft::dot(down(bn->forward(xe, ctx())), r);
  };
  bn->zero_grad();
  Tensor xd = up(x), rd = up(r);
  bn->forward(xd, ctx());
  const Tensor dx = down(bn->backward(rd, ctx()));
  const Tensor dgamma = down(grad(*bn, "weight")), dbeta = down(grad(*bn, "bias"));
  for (auto [t, g, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&gamma, &dgamma, "weight"},
                            std::tuple{&beta, &dbeta, "bias"}}) {
    auto res = ft::grad_check_detail(loss, *t, *g, 1e-2);
    EXPECT_LT(res.worst, 2e-2) << "d" << name;
    EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << "d" << name;
    EXPECT_GT(ft::l2_norm(*g), 0.0) << "d" << name;
  }
}

// ---- a small 3-D heatmap network: every backend against the CPU ----

std::unique_ptr<Sequential> heatmap_net() {
  auto m = std::make_unique<Sequential>();
  m->add("conv1", std::make_unique<Conv3d>(2, 4, 3, 1, 1));
  m->add("bn1", std::make_unique<BatchNorm3d>(4));
  m->add("relu", std::make_unique<ReLU>());
  m->add("pool", std::make_unique<MaxPool3d>(2, 2));
  m->add("conv2", std::make_unique<Conv3d>(4, 3, 3, 1, 1, false));
  m->add("up", std::make_unique<Upsample3d>(2));
  return m;
}

FANOUT_BACKEND_SUITE(VolumetricNetOnBackend);

TEST_P(VolumetricNetOnBackend, ForwardBackwardMatchCpu) {
  std::mt19937_64 rng(21);
  auto host = heatmap_net();
  host->init(5);
  std::vector<std::string> names;
  for (auto& [n, p] : host->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight"}));
  auto cpu = host->clone(Device::cpu());
  auto net = host->clone(dev());
  const Tensor x = ft::random_tensor(Shape{2, 2, 6, 8, 10}, rng);
  Context cpu_ctx(Device::cpu());
  const Tensor y_cpu = cpu->forward(x, cpu_ctx);
  EXPECT_EQ(y_cpu.shape(), (Shape{2, 3, 6, 8, 10}));
  const Tensor xd = up(x);
  const Tensor y = down(net->forward(xd, ctx()));
  EXPECT_LT(ft::max_rel_diff(y, y_cpu), tol(1e-6, 1e-4));
  EXPECT_GT(ft::l2_norm(y), 0.0);
  const Tensor r = ft::random_tensor(y_cpu.shape(), rng);
  cpu->zero_grad();
  net->zero_grad();
  const Tensor dx_cpu = cpu->backward(ft::clone(r), cpu_ctx);
  Tensor rd = up(r);
  const Tensor dx = down(net->backward(rd, ctx()));
  EXPECT_LT(ft::max_rel_diff(dx, dx_cpu), tol(1e-6, 1e-3));
  EXPECT_GT(ft::l2_norm(dx), 0.0);
  for (const std::string& n : names) {
    EXPECT_LT(ft::max_rel_diff(down(grad(*net, n)), grad(*cpu, n)), tol(1e-6, 1e-3)) << n;
    EXPECT_GT(ft::l2_norm(grad(*cpu, n)), 0.0) << n;
  }
  EXPECT_LT(ft::max_rel_diff(down(param(*net, "bn1.running_var")), param(*cpu, "bn1.running_var")), tol(1e-6, 1e-5));
}

TEST(VolumetricLayers, SteadyStateStepAllocatesNothing) {
  auto net = heatmap_net();
  net->init(6);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(22);
  const Tensor x = ft::random_tensor(Shape{2, 2, 6, 8, 10}, rng);
  const Tensor r = ft::random_tensor(Shape{2, 3, 6, 8, 10}, rng);
  Tensor dy = ft::clone(r);  // backward may overwrite its dy: one fresh copy per step, made outside the count
  net->forward(x, ctx);
  net->backward(dy, ctx);
  dy.copy_from(r);
  const uint64_t before = alloc_stats().host_allocs, plans = kernels::cpu::onednn_plans_made();
  net->forward(x, ctx);
  net->backward(dy, ctx);
  EXPECT_EQ(alloc_stats().host_allocs, before);
  EXPECT_EQ(kernels::cpu::onednn_plans_made(), plans);
}

// ---- central differences through the Module interface (CPU) ----

// d(sum(r * m(x)))/dx and /dparams for every parameter of m, by the
// library's check (runtime/nn/grad_check.h); m initialized with `seed`.
void check_module(Module& m, const Shape& in, uint64_t seed, double tol = 1e-2, double eps = 1e-3) {
  m.init(seed);
  const GradCheck c = check_gradients(m, in, seed, eps);
  ASSERT_TRUE(c.input_grad) << m.type_name() << " returned no input gradient";
  EXPECT_TRUE(c.zero_grads.empty()) << m.type_name() << ": " << c.report();
  EXPECT_LT(c.worst(), tol) << m.type_name() << ": " << c.report();
}

TEST(VolumetricLayerGrad, Conv3dStride2Pad1) {
  Conv3d m(2, 3, 3, 2, 1);
  check_module(m, Shape{2, 2, 5, 7, 6}, 31);
}

TEST(VolumetricLayerGrad, Conv3dNoBias1x1x1) {
  Conv3d m(3, 2, 1, 1, 0, false);
  check_module(m, Shape{2, 3, 3, 4, 5}, 32);
}

TEST(VolumetricLayerGrad, Conv3dKernel5Pad2) {
  Conv3d m(1, 2, 5, 1, 2);
  check_module(m, Shape{1, 1, 4, 6, 5}, 33);
}

TEST(VolumetricLayerGrad, BatchNorm3dTraining) {
  BatchNorm3d m(3);
  check_module(m, Shape{2, 3, 3, 4, 5}, 34);
}

TEST(VolumetricLayerGrad, MaxPool3d) {
  MaxPool3d m(3, 2, 1);
  // A small step: 27-value windows hold near-ties that a step of 1e-3 would cross.
  check_module(m, Shape{2, 3, 5, 7, 6}, 35, 1e-2, 1e-4);
}

TEST(VolumetricLayerGrad, Upsample3d) {
  Upsample3d m(2);
  check_module(m, Shape{2, 3, 3, 4, 5}, 36);
}

TEST(VolumetricLayerGrad, HeatmapNet) {
  auto m = heatmap_net();
  m->init(37);
  const GradCheck c = check_gradients(*m, Shape{2, 2, 4, 6, 6}, 37);
  ASSERT_TRUE(c.input_grad);
  // conv1's bias feeds BatchNorm, which subtracts every per-channel constant:
  // its true gradient is 0, so its central differences are float32 noise
  // alone, measured against the check's 1e-3 floor (0.50 of it on an AMD EPYC
  // with oneDNN, 2026-11-27). It is checked as zero instead, against conv1's
  // weight gradient; every other gradient a BatchNorm deep within 3e-2.
  EXPECT_LT(c.input_error, 3e-2) << c.report();
  for (const auto& [name, e] : c.param_errors)
    if (name != "conv1.bias") EXPECT_LT(e, 3e-2) << name << ": " << c.report();
  const Tensor grads = m->arenas().grads.to(Device::cpu());
  double bias = 0, weight = 0;
  for (auto& [name, p] : m->named_parameters()) {
    const Tensor g = grads.flat(p->offset, p->shape);
    for (int64_t i = 0; i < g.numel(); ++i) {
      if (name == "conv1.bias") bias = std::max(bias, std::abs(double(g.f32()[i])));
      if (name == "conv1.weight") weight = std::max(weight, std::abs(double(g.f32()[i])));
    }
  }
  EXPECT_GT(weight, 0.0);
  EXPECT_LT(bias, 1e-4 * weight) << "conv1.bias " << bias << ", conv1.weight " << weight;
}

TEST(VolumetricLayerGrad, GradientsAccumulateAndInputGradCanBeOff) {
  Conv3d m(2, 3, 3, 1, 1);
  m.init(38);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(39);
  Tensor x = ft::random_tensor(Shape{2, 2, 4, 5, 3}, rng);
  Tensor y = m.forward(x, ctx);
  Tensor r = ft::random_tensor(y.shape(), rng);
  m.zero_grad();
  EXPECT_TRUE(m.backward(ft::clone(r), ctx).defined());
  Tensor once = ft::clone(m.arenas().grads);
  m.set_input_grad(false);
  m.forward(x, ctx);
  EXPECT_FALSE(m.backward(ft::clone(r), ctx).defined());
  Tensor twice = m.arenas().grads;
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(twice.f32()[i], 2 * once.f32()[i], 1e-5);
  EXPECT_GT(ft::l2_norm(once), 0.0);
  MaxPool3d pool(2);
  Upsample3d up(2);
  pool.set_input_grad(false);
  up.set_input_grad(false);
  Tensor py = pool.forward(x, ctx), uy = up.forward(x, ctx);
  EXPECT_FALSE(pool.backward(ft::random_tensor(py.shape(), rng), ctx).defined());
  EXPECT_FALSE(up.backward(ft::random_tensor(uy.shape(), rng), ctx).defined());
}

// ---- errors ----

TEST(VolumetricLayers, BadShapesGiveOneLineErrors) {
  Context ctx(Device::cpu());
  const Tensor x4 = Tensor::zeros(Shape{2, 3, 6, 6});
  const Tensor x5 = Tensor::zeros(Shape{2, 3, 4, 6, 6});
  Conv3d conv(3, 4, 3);
  conv.init(1);
  ft::expect_user_error([&] { conv.forward(x4, ctx); }, {"Conv3d(3, 4, kernel 3", "(2, 3, 6, 6)"});
  ft::expect_user_error([&] { conv.forward(Tensor::zeros(Shape{2, 2, 4, 6, 6}), ctx); }, {"Conv3d", "(2, 2, 4, 6, 6)"});
  ft::expect_user_error([&] { conv.forward(Tensor::zeros(Shape{2, 3, 2, 6, 6}), ctx); }, {"Conv3d", "(2, 3, 2, 6, 6)"});
  BatchNorm3d bn(3);
  bn.init(1);
  ft::expect_user_error([&] { bn.forward(x4, ctx); }, {"BatchNorm3d(3)", "(2, 3, 6, 6)"});
  ft::expect_user_error([&] { bn.forward(Tensor::zeros(Shape{2, 4, 4, 6, 6}), ctx); }, {"BatchNorm3d(3)"});
  ft::expect_user_error([&] { bn.forward(Tensor::zeros(Shape{1, 3, 1, 1, 1}), ctx); },
                        {"BatchNorm3d", "more than one value per channel"});
  BatchNorm2d bn2(3);
  bn2.init(1);
  ft::expect_user_error([&] { bn2.forward(x5, ctx); }, {"BatchNorm2d(3)", "(2, 3, 4, 6, 6)"});
  MaxPool3d pool(3, 2, 1);
  ft::expect_user_error([&] { pool.forward(x4, ctx); }, {"MaxPool3d", "(2, 3, 6, 6)"});
  ft::expect_user_error([&] { MaxPool3d(4).forward(Tensor::zeros(Shape{1, 1, 3, 8, 8}), ctx); },
                        {"MaxPool3d", "(1, 1, 3, 8, 8)"});
  Upsample3d up(2);
  ft::expect_user_error([&] { up.forward(x4, ctx); }, {"Upsample3d", "(2, 3, 6, 6)"});
  ft::expect_user_error([] { Upsample3d(0); }, {"Upsample3d", "0"});
  ft::expect_user_error([] { MaxPool3d(2, 2, 2); }, {"MaxPool3d", "padding 2"});
  ft::expect_user_error([] { Conv3d(3, 4, 0); }, {"Conv3d", "kernel 0"});
}

}  // namespace
}  // namespace fanout::models
