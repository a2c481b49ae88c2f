// The layers added for users' own models, under DataParallel: models with
// InstanceNorm2d (with and without affine parameters), with LayerNorm, with
// Dropout and with InstanceNorm3d and AvgPool3d trained 10 SGD steps on cpu:2 and cpu:3 equal one device bit
// for bit (split-invariant math: per-sample statistics, exact gradient sums,
// and Dropout's mask drawn by the sample's row in the whole batch). An
// engine told which pass comes next (set_pass, as the Trainer does from its
// position) draws that pass's mask, as a resumed run must.
#include <gtest/gtest.h>

#include <functional>

#include "models/layers/activation.h"
#include "models/layers/conv.h"
#include "models/layers/pooling.h"
#include "models/layers/dropout.h"
#include "models/layers/flatten.h"
#include "models/layers/groupnorm.h"
#include "models/layers/layernorm.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "models/layers/smooth_activation.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine_factory.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

std::unique_ptr<Module> instance_norm_net(bool affine) {
  auto m = std::make_unique<models::Sequential>();
  m->add("conv", std::make_unique<models::Conv2d>(1, 4, 3, 1, 1));
  m->add("norm", std::make_unique<models::InstanceNorm>(2, 4, 1e-5f, affine));
  m->add("relu", std::make_unique<models::ReLU>());
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc", std::make_unique<models::Linear>(4 * 8 * 8, 10));
  m->init(6);
  return m;
}

// Volumes (1, 4, 4, 4): Conv3d, InstanceNorm3d, AvgPool3d.
std::unique_ptr<Module> volume_net(bool affine) {
  auto m = std::make_unique<models::Sequential>();
  m->add("conv", std::make_unique<models::Conv3d>(1, 3, 3, 1, 1));
  m->add("norm", std::make_unique<models::InstanceNorm>(3, 3, 1e-5f, affine));
  m->add("pool", std::make_unique<models::AvgPool3d>(2));
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc", std::make_unique<models::Linear>(3 * 8, 10));
  m->init(6);
  return m;
}

// The smooth activations (affine: LeakyReLU in place of Tanh).
std::unique_ptr<Module> activation_net(bool affine) {
  auto m = std::make_unique<models::Sequential>();
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc1", std::make_unique<models::Linear>(64, 32));
  m->add("gelu", models::GELU());
  m->add("fc2", std::make_unique<models::Linear>(32, 32));
  m->add("silu", models::SiLU());
  m->add("fc3", std::make_unique<models::Linear>(32, 32));
  m->add("act", affine ? models::LeakyReLU(0.1f) : models::Tanh());
  m->add("fc4", std::make_unique<models::Linear>(32, 32));
  m->add("sigmoid", models::Sigmoid());
  m->add("fc5", std::make_unique<models::Linear>(32, 10));
  m->init(6);
  return m;
}

std::unique_ptr<Module> layer_norm_net(bool affine) {
  auto m = std::make_unique<models::Sequential>();
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc1", std::make_unique<models::Linear>(64, 32));
  m->add("norm", std::make_unique<models::LayerNorm>(Shape{32}, 1e-5f, affine));
  m->add("relu", std::make_unique<models::ReLU>());
  m->add("fc2", std::make_unique<models::Linear>(32, 10));
  m->init(6);
  return m;
}

std::unique_ptr<Module> dropout_net(bool inplace) {
  auto m = std::make_unique<models::Sequential>();
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc1", std::make_unique<models::Linear>(64, 32));
  m->add("relu", std::make_unique<models::ReLU>());
  m->add("drop", std::make_unique<models::Dropout>(0.4f, inplace));
  m->add("fc2", std::make_unique<models::Linear>(32, 10));
  m->init(6);
  return m;
}

Tensor train(const std::function<std::unique_ptr<Module>()>& make, const std::string& devices,
             const std::vector<testing::Batch>& data) {
  return testing::trained_params(*make(), devices, data);
}

TEST(NewLayersUnderDataParallel, EachNewLayerEqualsOneDevice) {
  const auto images = testing::random_batches(Shape{1, 8, 8}, 12, 10, 17);
  const auto volumes = testing::random_batches(Shape{1, 4, 4, 4}, 12, 10, 19);
  for (bool affine : {false, true})
    for (auto make : {instance_norm_net, layer_norm_net, dropout_net, volume_net, activation_net}) {
      SCOPED_TRACE(std::string(make == instance_norm_net ? "InstanceNorm2d"
                               : make == layer_norm_net  ? "LayerNorm"
                               : make == dropout_net     ? "Dropout"
                               : make == volume_net      ? "InstanceNorm3d and AvgPool3d"
                                                         : "GELU, SiLU, Tanh/LeakyReLU, Sigmoid") +
                   (affine ? ", affine (in place)" : ""));
      auto build = [&] { return make(affine); };
      const auto& data = make == volume_net ? volumes : images;
      const Tensor one = train(build, "cpu", data);
      for (const char* devices : {"cpu:2", "cpu:3"})
        EXPECT_TRUE(testing::same_bits(train(build, devices, data), one)) << devices;
      const Tensor init = make(affine)->arenas().params;
      EXPECT_GT(testing::max_rel_diff(one, init), 1e-3) << "training moved the parameters";
    }
}

TEST(NewLayersUnderDataParallel, SetPassDrawsThatPassesDropoutMask) {
  const auto data = testing::random_batches(Shape{1, 8, 8}, 12, 4, 18);
  auto grads_of_pass = [&](const std::string& devices, uint64_t skip_by_running, uint64_t set) {
    auto m = dropout_net(false);
    auto e = make_engine(*m, testing::engine_on(devices));
    for (uint64_t i = 0; i < skip_by_running; ++i) e->forward_backward_batch(data[i].x, data[i].y);
    m->zero_grad();
    if (set > 0) e->set_pass(set);
    e->forward_backward_batch(data[3].x, data[3].y);
    return m->arenas().grads.to(Device::cpu());
  };
  for (const char* devices : {"cpu", "cpu:2"}) {
    SCOPED_TRACE(devices);
    const Tensor third = grads_of_pass(devices, 3, 0);  // the 4th pass, counted by the engine
    EXPECT_TRUE(testing::same_bits(grads_of_pass(devices, 0, 3), third)) << "set_pass(3) on a fresh engine";
    EXPECT_FALSE(testing::same_bits(grads_of_pass(devices, 0, 0), third)) << "pass 0 draws another mask";
  }
}

}  // namespace
}  // namespace fanout
