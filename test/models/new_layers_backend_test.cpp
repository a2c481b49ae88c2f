// The layers users reach for, as layers, on every backend: InstanceNorm
// (with and without affine), LayerNorm (with and without), Dropout,
// AvgPool3d and ConvTranspose2d/3d run forward and backward on the backend
// and on the CPU from the same initialization, input, output gradient and
// Dropout key; outputs, input gradients and parameter gradients agree to
// float32 rounding (the CPU kernels are held to float64 references in their
// own tests). This is where the layers' device code (the identity gamma of
// the affine-free norms, the bias kernels, the undefined dW of the
// transposed convolution's forward) runs on a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <tuple>

#include "kernels/activation.h"
#include "kernels/backend_test_util.h"
#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/storage_test_util.h"
#include "models/layers/basic_block.h"
#include "models/layers/conv_transpose.h"
#include "models/layers/dropout.h"
#include "models/layers/groupnorm.h"
#include "models/layers/layernorm.h"
#include "models/layers/pooling.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct LayerCase {
  const char* name;
  std::function<std::unique_ptr<Module>()> make;
  Shape input;
};

FANOUT_BACKEND_SUITE(NewLayersOnBackend);

TEST_P(NewLayersOnBackend, ForwardBackwardMatchCpu) {
  const std::vector<LayerCase> cases = {
      {"InstanceNorm2d", [] { return std::make_unique<models::InstanceNorm>(2, 3); }, Shape{2, 3, 5, 4}},
      {"InstanceNorm3d affine", [] { return std::make_unique<models::InstanceNorm>(3, 2, 1e-5f, true); },
       Shape{2, 2, 3, 4, 3}},
      {"LayerNorm", [] { return std::make_unique<models::LayerNorm>(Shape{6}); }, Shape{3, 4, 6}},
      {"LayerNorm without affine", [] { return std::make_unique<models::LayerNorm>(Shape{2, 5}, 1e-5f, false); },
       Shape{3, 2, 5}},
      {"Dropout", [] { return std::make_unique<models::Dropout>(0.3f); }, Shape{4, 3, 7}},
      {"AvgPool3d", [] { return std::make_unique<models::AvgPool3d>(3, 2, 1); }, Shape{2, 2, 5, 6, 4}},
      {"ConvTranspose2d", [] { return std::make_unique<models::ConvTranspose>(2, 3, 2, 3, 2, 1, 1); },
       Shape{2, 3, 4, 5}},
      {"ConvTranspose3d", [] { return std::make_unique<models::ConvTranspose>(3, 2, 3, 2, 2); }, Shape{1, 2, 3, 2, 3}},
  };
  std::mt19937_64 rng(601);
  for (const LayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto cpu = c.make(), dv = c.make();
    cpu->init(9);
    dv->init(9);
    cpu->set_input_grad(true);
    dv->set_input_grad(true);
    dv->to(dev());
    Context host(Device::cpu());
    host.pass_key = ctx().pass_key = 1234;  // Dropout draws the same mask
    const Tensor x = ft::random_tensor(c.input, rng);
    const Tensor want_y = cpu->forward(x, host).to(Device::cpu());
    const Tensor got_y = down(dv->forward(up(x), ctx()));
    ASSERT_EQ(got_y.shape(), want_y.shape());
    EXPECT_LT(ft::max_rel_diff(got_y, want_y), 1e-5);
    const Tensor dy = ft::random_tensor(want_y.shape(), rng);
    cpu->zero_grad();
    dv->zero_grad();
    const Tensor want_dx = cpu->backward(ft::clone(dy), host).to(Device::cpu());
    const Tensor got_dx = down(dv->backward(up(dy), ctx()));
    EXPECT_LT(ft::max_rel_diff(got_dx, want_dx), 1e-5);
    EXPECT_GT(ft::l2_norm(want_dx), 0.0);
    if (cpu->named_parameters().empty()) continue;
    EXPECT_LT(ft::max_rel_diff(down(dv->arenas().grads), cpu->arenas().grads.to(Device::cpu())), 1e-5);
  }
}

// A batch norm runs with the ReLU after it (Sequential, an in-place ReLU)
// and with the residual add (BasicBlock) as one pass: the outputs, input
// gradients, parameter gradients and running statistics are bit for bit
// those of the same layers run one by one (a non-in-place ReLU, which
// Sequential does not fuse; BasicBlock's children called in turn), in
// float32 and under bfloat16 autocast (low-type channels-last activations;
// on a GPU there, cuDNN's fused graphs: within bfloat16's roundings).
TEST_P(NewLayersOnBackend, BatchNormWithReluAndAddHasTheUnfusedBits) {
  using models::BasicBlock;
  using models::BatchNorm2d;
  using models::Conv2d;
  using models::ReLU;
  using models::Sequential;
  std::mt19937_64 rng(602);
  for (DType autocast : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(autocast));
    ctx().math.autocast = autocast;
    const Shape in{3, 4, 6, 5};
    const Tensor x = ft::random_tensor(in, rng);
    auto prepare = [&](Module& m) {
      m.init(11);
      m.set_input_grad(true);
      m.to(dev());
      m.zero_grad();
    };
    // The run's results on the host: output, input gradient, gradients, buffers.
    auto results = [&](const Tensor& y, const Tensor& dx, Module& m) {
      std::vector<Tensor> r{down(y), down(dx), down(m.arenas().grads)};
      for (auto& [n, b] : m.named_buffers()) r.push_back(down(b->value));
      return r;
    };
    // On a GPU under autocast the fused passes are cuDNN's graphs (float32
    // statistics, one rounding fewer): within bfloat16's roundings there.
    const bool exact = !on_cuda() || autocast == DType::F32;
    auto expect_same = [exact](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (exact || a[i].dtype() == DType::I64)
          EXPECT_TRUE(ft::same_bits(a[i], b[i])) << "result " << i;
        else
          EXPECT_LT(ft::max_rel_diff(ft::float32_values(a[i]), ft::float32_values(b[i])), 3e-2) << "result " << i;
      }
      EXPECT_GT(ft::l2_norm(ft::float32_values(a[1])), 0.0);
    };

    auto seq = [](bool inplace) {
      auto s = std::make_unique<Sequential>();
      s->add(std::make_unique<Conv2d>(4, 6, 3, 1, 1, false));
      s->add(std::make_unique<BatchNorm2d>(6));
      s->add(std::make_unique<ReLU>(inplace));
      return s;
    };
    auto fused = seq(true), plain = seq(false);
    prepare(*fused);
    prepare(*plain);
    Tensor dy;
    std::vector<Tensor> want, got;
    for (int step = 0; step < 2; ++step) {  // twice: the running statistics move on
      const Tensor yp = plain->forward(up(x), ctx());
      if (!dy.defined()) dy = ft::random_tensor(yp.shape(), rng);
      want = results(yp, plain->backward(up(dy), ctx()), *plain);
      const Tensor yf = fused->forward(up(x), ctx());
      got = results(yf, fused->backward(up(dy), ctx()), *fused);
    }
    {
      SCOPED_TRACE("Sequential");
      expect_same(got, want);
    }

    for (auto [cin, cout, stride] : {std::tuple{4, 8, 2}, std::tuple{4, 4, 1}}) {
      SCOPED_TRACE("BasicBlock " + std::to_string(cin) + " to " + std::to_string(cout));
      BasicBlock block(cin, cout, stride), parts(cin, cout, stride);
      prepare(block);
      prepare(parts);
      std::map<std::string, Module*> p;
      for (auto& [n, m] : parts.named_modules()) p[n] = m;
      Context& c = ctx();
      // Inside a model the block's input is an activation in autocast's storage.
      const Tensor xb = autocast == DType::F32 ? x : ft::stored_copy(x, autocast, MemoryFormat::ChannelsLast);
      // The block's layers one by one, as it ran them before the fusion.
      Tensor h = p["bn1"]->forward(p["conv1"]->forward(up(xb), c), c);
      h = p["bn2"]->forward(p["conv2"]->forward(p["relu"]->forward(h, c), c), c);
      const Tensor shortcut = p.count("downsample") ? p["downsample"]->forward(up(xb), c) : up(xb);
      Tensor y = h;
      kernels::add(c, y, shortcut, y, c.math.autocast);
      kernels::relu_forward(c, y, y);
      const Tensor dyb = ft::random_tensor(y.shape(), rng);
      Tensor dsum = up(dyb);
      if (dsum.dtype() != y.dtype() || dsum.format() != y.format()) {
        Tensor moved = Tensor::empty(y.shape(), y.dtype(), y.device(), y.format());
        kernels::convert(c, dsum, moved);
        dsum = moved;
      }
      kernels::relu_backward(c, y, dsum, dsum);
      const Tensor dshort = p.count("downsample") ? p["downsample"]->backward(dsum, c) : dsum;
      Tensor g = p["bn2"]->backward(dsum, c);
      g = p["bn1"]->backward(p["relu"]->backward(p["conv2"]->backward(g, c), c), c);
      g = p["conv1"]->backward(g, c);
      kernels::add(c, g, dshort, g, c.math.autocast);
      want = results(y, g, parts);
      const Tensor yb = block.forward(up(xb), c);
      got = results(yb, block.backward(up(dyb), c), block);
      expect_same(got, want);
    }
    ctx().math.autocast = DType::F32;
  }
}

// relu_grad belongs to a forward_add_relu: after a plain forward it is a
// one-line error naming itself.
TEST_P(NewLayersOnBackend, BatchNormReluGradNeedsTheFusedForward) {
  std::mt19937_64 rng(603);
  models::BatchNorm2d bn(4);
  bn.init(3);
  bn.set_input_grad(true);
  bn.to(dev());
  const Tensor x = up(ft::random_tensor(Shape{2, 4, 3, 3}, rng)), dy = up(ft::random_tensor(Shape{2, 4, 3, 3}, rng));
  bn.forward(x, ctx());
  try {
    bn.relu_grad(dy, ctx());
    FAIL() << "relu_grad ran after a plain forward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("relu_grad"), std::string::npos) << e.what();
  }
  bn.train();
  const Tensor y = down(bn.forward_add_relu(x, nullptr, ctx()));
  const Tensor g = down(bn.relu_grad(up(down(dy)), ctx()));
  const Tensor dyh = down(dy);
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(g.f32()[i], y.f32()[i] > 0.0f ? dyh.f32()[i] : 0.0f) << i;
}

// Backward through an eval-mode BatchNorm (frozen statistics), as torch
// differentiates it: y = (x - rm) * k + beta, k = gamma / sqrt(rv + eps), so
// dx = dy * k, dgamma = sum(dy * (x - rm) / sqrt(rv + eps)), dbeta = sum(dy)
// (float64 here), with the ReLU's mask after forward_add_relu; the running
// statistics do not move.
TEST_P(NewLayersOnBackend, EvalModeBatchNormBackwardIsTheFixedAffineMap) {
  std::mt19937_64 rng(605);
  for (bool relu : {false, true}) {
    SCOPED_TRACE(relu ? "forward_add_relu" : "forward");
    models::BatchNorm2d bn(3);
    bn.init(4);
    bn.set_input_grad(true);
    bn.to(dev());
    bn.train();
    bn.forward(up(ft::random_tensor(Shape{4, 3, 5, 2}, rng)), ctx());  // running statistics away from (0, 1)
    bn.zero_grad();
    const Tensor rm = down(bn.named_buffers()[0].second->value), rv = down(bn.named_buffers()[1].second->value);
    bn.eval();
    const Shape s{2, 3, 4, 5};
    const Tensor x = ft::random_tensor(s, rng), dy = ft::random_tensor(s, rng);
    const Tensor y = down(relu ? bn.forward_add_relu(up(x), nullptr, ctx()) : bn.forward(up(x), ctx()));
    const Tensor dx = down(relu ? bn.backward(bn.relu_grad(up(dy), ctx()), ctx()) : bn.backward(up(dy), ctx()));
    std::map<std::string, Tensor> grads;
    for (auto& [n, p] : bn.named_parameters()) grads[n] = down(p->grad);
    const Tensor gamma = down(bn.named_parameters()[0].second->value);
    std::vector<double> dgamma(3, 0.0), dbeta(3, 0.0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = (i / 20) % 3;
      const double is = 1.0 / std::sqrt(static_cast<double>(rv.f32()[c]) + 1e-5);
      const double g = relu && y.f32()[i] <= 0.0f ? 0.0 : dy.f32()[i];
      EXPECT_NEAR(dx.f32()[i], g * gamma.f32()[c] * is, 1e-5 * (1.0 + std::abs(g))) << i;
      dgamma[c] += g * (x.f32()[i] - rm.f32()[c]) * is;
      dbeta[c] += g;
    }
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(grads["weight"].f32()[c], dgamma[c], 1e-4 * (1.0 + std::abs(dgamma[c]))) << c;
      EXPECT_NEAR(grads["bias"].f32()[c], dbeta[c], 1e-4 * (1.0 + std::abs(dbeta[c]))) << c;
    }
    EXPECT_TRUE(ft::same_bits(down(bn.named_buffers()[0].second->value), rm)) << "running mean moved";
    EXPECT_TRUE(ft::same_bits(down(bn.named_buffers()[1].second->value), rv)) << "running variance moved";
  }
}

// A block whose input is stored low-type but not channels-last (a layer of
// the user's before it) adds its shortcut in the layers' format: the same
// output, input gradient and parameter gradients as a channels-last input.
TEST_P(NewLayersOnBackend, BasicBlockTakesALowTypeInputInEitherFormat) {
  std::mt19937_64 rng(604);
  ctx().math.autocast = DType::BF16;
  const Tensor x = ft::random_tensor(Shape{2, 4, 7, 5}, rng), dy = ft::random_tensor(Shape{2, 4, 7, 5}, rng);
  const auto logical = [&](const Tensor& t) {  // float32 NCHW on the host
    Tensor f = Tensor::empty(t.shape(), DType::F32, dev());
    kernels::convert(ctx(), t, f);
    return down(f);
  };
  std::vector<std::vector<Tensor>> runs;
  for (MemoryFormat f : {MemoryFormat::ChannelsLast, MemoryFormat::Contiguous}) {
    models::BasicBlock block(4, 4, 1);
    block.init(12);
    block.set_input_grad(true);
    block.to(dev());
    block.zero_grad();
    const Tensor y = block.forward(up(ft::stored_copy(x, DType::BF16, f)), ctx());
    const Tensor dyd = up(ft::stored_copy(dy, y.dtype(), y.format()));
    const Tensor dx = block.backward(dyd, ctx());
    runs.push_back({logical(y), logical(dx), down(block.arenas().grads)});
  }
  ctx().math.autocast = DType::F32;
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_TRUE(ft::same_bits(runs[0][i], runs[1][i])) << "result " << i;
  EXPECT_GT(ft::l2_norm(runs[1][1]), 0.0);
}

}  // namespace
}  // namespace fanout
