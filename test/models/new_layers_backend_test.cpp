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

#include "kernels/backend_test_util.h"
#include "models/layers/conv_transpose.h"
#include "models/layers/dropout.h"
#include "models/layers/groupnorm.h"
#include "models/layers/layernorm.h"
#include "models/layers/pooling.h"
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

}  // namespace
}  // namespace fanout
