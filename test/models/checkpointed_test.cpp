// Activation checkpointing: Checkpointed blocks recompute their forward in
// backward from shared activation buffers; gradients, parameters and
// BatchNorm's running statistics are bit for bit those without it, on one
// device and under DataParallel (SyncBatchNorm included), and a GPT holds
// far fewer activation bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "models/layers/activation.h"
#include "models/layers/checkpointed.h"
#include "models/layers/dropout.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "models/zoo/zoo.h"
#include "runtime/core/memory.h"
#include "runtime/data/dataset.h"
#include "runtime/train/trainer.h"
#include "runtime/nn/criterion.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using models::Checkpointed;

constexpr const char* kGpt = "gpt:n_layer=3,n_head=2,n_embd=16,block_size=8,vocab_size=11,dropout=0.1";

struct Case {
  std::string model, devices;
  bool sync_bn = false;
  DType autocast = DType::F32;  // BF16, F16: the mixed precisions' low-type channels-last activations
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " on " << c.devices << (c.sync_bn ? " sync_bn" : "")
      << (c.autocast == DType::F32 ? "" : std::string(" autocast ") + dtype_name(c.autocast));
}

bool is_gpt_model(const std::string& m) { return m.rfind("gpt", 0) == 0; }

Shape sample_of(const std::string& m) {
  if (is_gpt_model(m)) return Shape{8};
  if (m.rfind("heatmap3d", 0) == 0) return Shape{1, 8, 8, 8};
  return Shape{3, 8, 8};
}

int classes_of(const std::string& m) { return is_gpt_model(m) ? 11 : m.rfind("heatmap3d", 0) == 0 ? 2 : 10; }

using testing::random_ids;

std::vector<testing::Batch> batches_for(const std::string& m, int64_t rows, int steps, uint64_t seed) {
  if (!is_gpt_model(m)) {
    if (m.rfind("heatmap3d", 0) != 0) return testing::random_batches(sample_of(m), rows, steps, seed);
    std::mt19937_64 rng(seed);
    std::vector<testing::Batch> out;
    for (int s = 0; s < steps; ++s)
      out.push_back({testing::random_tensor(Shape{rows, 1, 8, 8, 8}, rng),
                     testing::random_heatmaps(Shape{rows, 2, 8, 8, 8}, rng)});
    return out;
  }
  std::mt19937_64 rng(seed);
  std::vector<testing::Batch> out;
  for (int s = 0; s < steps; ++s) out.push_back({random_ids(rows, 8, 11, rng), random_ids(rows, 8, 11, rng)});
  return out;
}

EngineSpec spec_for(const Case& c) {
  EngineSpec spec = testing::engine_on(c.devices, /*split_invariant=*/false);
  spec.dp.sync_bn = c.sync_bn;
  spec.dp.math.autocast = c.autocast;
  if (is_gpt_model(c.model)) spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  else if (models::dense_output(c.model)) spec.loss.criterion = CriterionKind::Mse;
  return spec;
}

struct Outcome {
  Tensor params, buffers, grads;
  std::vector<double> losses;
  std::vector<int64_t> batches_tracked;
};

// Three SGD steps (momentum, weight decay), then one more forward and
// backward whose gradients are kept.
Outcome train(const Case& c, bool checkpoint) {
  auto m = models::make_model(c.model, sample_of(c.model), classes_of(c.model), 7, checkpoint);
  testing::EngineRun e(make_engine(*m, spec_for(c)));
  const auto data = batches_for(c.model, 6, 4, 11);
  Outcome o;
  for (int s = 0; s < 3; ++s) o.losses.push_back(e.train_step(data[s].x, data[s].y, 0.05f).loss.value());
  e->forward_backward_batch(data[3].x, data[3].y);
  o.params = m->arenas().params.to(Device::cpu());
  o.buffers = m->arenas().buffers.to(Device::cpu());
  o.grads = m->arenas().grads.to(Device::cpu());
  for (auto& [name, b] : m->named_buffers())
    if (b->dtype == DType::I64) o.batches_tracked.push_back(b->value.data<int64_t>()[0]);
  return o;
}

class CheckpointedModel : public ::testing::TestWithParam<Case> {};

TEST_P(CheckpointedModel, BitForBitThoseWithoutIt) {
  const Case& c = GetParam();
  const Outcome plain = train(c, false), ckpt = train(c, true);
  EXPECT_TRUE(testing::same_bits(ckpt.grads, plain.grads));
  EXPECT_TRUE(testing::same_bits(ckpt.params, plain.params));
  EXPECT_TRUE(testing::same_bits(ckpt.buffers, plain.buffers)) << "BatchNorm's running statistics";
  EXPECT_EQ(ckpt.losses, plain.losses);
  EXPECT_EQ(ckpt.batches_tracked, plain.batches_tracked) << "running statistics updated once a forward";
  for (int64_t n : plain.batches_tracked) EXPECT_EQ(n, 4);
  auto init = models::make_model(c.model, sample_of(c.model), classes_of(c.model), 7);
  EXPECT_GT(testing::max_rel_diff(plain.params, init->arenas().params), 1e-4) << "training moved the parameters";
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, CheckpointedModel,
    ::testing::Values(Case{"resnet18", "cpu"}, Case{"resnet18", "cpu:2"}, Case{"resnet18", "cpu:2", true},
                      Case{"heatmap3d", "cpu"}, Case{"heatmap3d", "cpu:3", true}, Case{"heatmap3d:group", "cpu:2"},
                      Case{kGpt, "cpu"}, Case{kGpt, "cpu:2"}, Case{"resnet18", "cpu", false, DType::BF16},
                      Case{"resnet18", "cpu:2", true, DType::F16}, Case{"heatmap3d", "cpu", false, DType::BF16},
                      Case{kGpt, "cpu", false, DType::BF16}),
    [](const ::testing::TestParamInfo<Case>& i) {
      std::string n = i.param.model.substr(0, i.param.model.find(',')) + "_" + i.param.devices +
                      (i.param.sync_bn ? "_syncbn" : "") +
                      (i.param.autocast == DType::F32 ? "" : std::string("_") + dtype_name(i.param.autocast));
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

TEST(Checkpointed, NamesAndInitialValuesAreTheModelsWithout) {
  for (const char* name : {"resnet18", "heatmap3d", "heatmap3d:group", kGpt}) {
    SCOPED_TRACE(name);
    auto plain = models::make_model(name, sample_of(name), classes_of(name), 3);
    auto ckpt = models::make_model(name, sample_of(name), classes_of(name), 3, true);
    std::vector<std::string> a, b;
    for (auto& [n, t] : plain->state_dict()) a.push_back(n);
    for (auto& [n, t] : ckpt->state_dict()) b.push_back(n);
    EXPECT_EQ(a, b);
    EXPECT_TRUE(testing::same_bits(plain->arenas().params, ckpt->arenas().params));
    int wrapped = 0;
    for (auto& [n, mod] : ckpt->named_modules()) wrapped += dynamic_cast<Checkpointed*>(mod) != nullptr;
    EXPECT_EQ(wrapped, std::string(name) == "resnet18" ? 8 : name == std::string(kGpt) ? 3 : 5);
  }
}

TEST(Checkpointed, UnnamedWrappersCannotGiveTwoTensorsOneName) {
  auto block = [] {
    auto s = std::make_unique<models::Sequential>();
    s->add("fc", std::make_unique<models::Linear>(4, 4));
    return std::make_unique<Checkpointed>(std::move(s));
  };
  models::Sequential m;
  m.add("", block());
  m.add("", block());
  EXPECT_EQ(testing::error_of([&] { m.init(1); }), "two parameters are named 'fc.weight'");
}

TEST(Checkpointed, ModelWithoutBlocksIsOneLine) {
  EXPECT_EQ(testing::error_of([] { models::make_model("lenet", Shape{1, 28, 28}, 10, 1, true); }),
            "model lenet has no blocks to checkpoint (resnet18, heatmap3d and gpt have)");
}

// Blocks that overwrite their input in place, one that returns its input,
// a plain layer between two checkpointed blocks and a checkpointed block
// inside another: the same gradients as the model without the wrappers.
std::unique_ptr<Module> edge_model(bool checkpoint) {
  auto wrap = [&](std::unique_ptr<Module> m) { return models::checkpointed_if(checkpoint, std::move(m)); };
  auto m = std::make_unique<models::Sequential>();
  m->add("fc1", std::make_unique<models::Linear>(6, 8));
  auto b1 = std::make_unique<models::Sequential>();
  b1->add("drop", std::make_unique<models::Dropout>(0.3f, /*inplace=*/true));  // not idempotent
  b1->add("fc", std::make_unique<models::Linear>(8, 8));
  b1->add("relu", std::make_unique<models::ReLU>(/*inplace=*/true));
  m->add("b1", wrap(std::move(b1)));
  m->add("relu", std::make_unique<models::ReLU>(/*inplace=*/true));
  auto b2 = std::make_unique<models::Sequential>();
  b2->add("fc", std::make_unique<models::Linear>(8, 8));
  auto inner = std::make_unique<models::Sequential>();
  inner->add("fc", std::make_unique<models::Linear>(8, 8));
  inner->add("relu", std::make_unique<models::ReLU>());
  b2->add("inner", wrap(std::move(inner)));
  m->add("b2", wrap(std::move(b2)));
  m->add("same", wrap(std::make_unique<models::Dropout>(0.0f)));
  m->add("fc2", std::make_unique<models::Linear>(8, 5));
  m->init(5);
  m->set_input_grad(true);
  return m;
}

TEST(Checkpointed, InPlaceNestedAndPlainNeighboursBitForBit) {
  std::mt19937_64 rng(4);
  const Tensor x = testing::random_tensor(Shape{7, 6}, rng), dy = testing::random_tensor(Shape{7, 5}, rng);
  Tensor want_dx, want_g, want_y;
  for (bool checkpoint : {false, true}) {
    auto m = edge_model(checkpoint);
    Context ctx(Device::cpu());
    ctx.pass_key = 99;
    Tensor y, dx;
    for (int rep = 0; rep < 2; ++rep) {  // the second pass reuses the shared buffers
      m->zero_grad();
      y = testing::clone(m->forward(testing::clone(x), ctx));
      dx = testing::clone(Module::backward_of(*m, "model", testing::clone(dy), ctx));
    }
    if (!checkpoint) {
      want_y = y, want_dx = dx, want_g = testing::clone(m->arenas().grads);
      continue;
    }
    EXPECT_TRUE(testing::same_bits(y, want_y));
    EXPECT_TRUE(testing::same_bits(dx, want_dx));
    EXPECT_TRUE(testing::same_bits(m->arenas().grads, want_g));
    EXPECT_EQ(ctx.slots, nullptr);
    EXPECT_FALSE(ctx.recomputing);
  }
}

// Activation bytes: what a GPT's forward and backward add to its device
// (the allocator's peak over two passes, above what was live before them).
size_t gpt_activation_bytes(bool checkpoint) {
  const std::string name = "gpt:n_layer=8,n_head=4,n_embd=64,block_size=32,vocab_size=11,dropout=0.1";
  auto m = models::make_model(name, Shape{32}, 11, 1, checkpoint);
  EngineSpec spec = testing::engine_on("cpu", false);
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  auto e = make_engine(*m, std::move(spec));
  std::mt19937_64 rng(2);
  const Tensor x = random_ids(8, 32, 11, rng), y = random_ids(8, 32, 11, rng);
  const Device d = Device::cpu();
  reset_cpu_device_peak_bytes(d);
  const size_t live = cpu_device_live_bytes(d);
  for (int rep = 0; rep < 2; ++rep) e->forward_backward_batch(x, y);
  return cpu_device_peak_bytes(d) - live;
}

TEST(Checkpointed, GptActivationBytesAtLeastHalved) {
  const size_t plain = gpt_activation_bytes(false), ckpt = gpt_activation_bytes(true);
  std::printf("GPT (8 layers, n_embd 64, batch 8 x 32 tokens): activation bytes %zu without checkpointing, %zu with "
              "(%.2fx)\n", plain, ckpt, static_cast<double>(plain) / static_cast<double>(ckpt));
  ::testing::Test::RecordProperty("activation_bytes_plain", std::to_string(plain));
  ::testing::Test::RecordProperty("activation_bytes_checkpointed", std::to_string(ckpt));
  EXPECT_GT(ckpt, 0u);
  EXPECT_LE(2 * ckpt, plain);
}

// The epoch metrics break each replica's memory down by kind; checkpointing
// shows as fewer activation bytes on every replica.
std::vector<train::ReplicaMemory> trained_memory(bool checkpoint) {
  const std::string name = "gpt:n_layer=6,n_head=2,n_embd=32,block_size=16,vocab_size=11,dropout=0.1";
  std::mt19937_64 rng(6);
  data::TensorDataset train_set(random_ids(48, 16, 11, rng), random_ids(48, 16, 11, rng));
  data::TensorDataset test_set(random_ids(16, 16, 11, rng), random_ids(16, 16, 11, rng));
  auto m = models::make_model(name, Shape{16}, 11, 1, checkpoint);
  EngineSpec spec = testing::engine_on("cpu:2", false);
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw());
  train::TrainerConfig tc;
  tc.batch_size = 8;
  tc.progress = train::Progress::Mode::Off;
  tc.summary_out = nullptr;
  train::Trainer t(tc, *e.engine, *e.opt, train_set, test_set);
  const train::EpochMetrics last = t.run();
  const int64_t params = static_cast<int64_t>(m->arenas().params.nbytes());
  EXPECT_EQ(last.replica_memory.size(), 2u);
  EXPECT_EQ(last.replica_bytes.size(), 2u);
  for (size_t i = 0; i < last.replica_memory.size() && i < last.replica_bytes.size(); ++i) {
    const train::ReplicaMemory& r = last.replica_memory[i];
    EXPECT_EQ(r.params, i == 0 ? params : 0) << "CPU replicas read the primary's parameters";
    EXPECT_EQ(r.grads, params);
    EXPECT_EQ(r.optimizer_state, i == 0 ? 3 * params : 0) << "AdamW with amsgrad, unsharded: on the primary";
    EXPECT_EQ(r.params + r.grads + r.buffers + r.optimizer_state, last.replica_bytes[i]);
    EXPECT_GT(r.activations, 0);
  }
  const nlohmann::json j = train::metrics_json(last);
  EXPECT_EQ(j["replica_memory"].size(), 2u);
  EXPECT_EQ(j["replica_memory"][1]["activations"].get<int64_t>(), last.replica_memory.at(1).activations);
  return last.replica_memory;
}

TEST(Checkpointed, EpochMetricsBreakMemoryDown) {
  const auto plain = trained_memory(false), ckpt = trained_memory(true);
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(ckpt.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    std::printf("replica %zu activations: %lld bytes without checkpointing, %lld with\n", i,
                static_cast<long long>(plain[i].activations), static_cast<long long>(ckpt[i].activations));
    EXPECT_LE(2 * ckpt[i].activations, plain[i].activations) << "replica " << i;
  }
}

TEST(Checkpointed, WarmStepAllocatesNothing) {
  for (const Case& c : {Case{kGpt, "cpu:2"}, Case{"resnet18", "cpu"}, Case{"heatmap3d", "cpu:2", true}}) {
    SCOPED_TRACE(c.model + " " + c.devices);
    auto m = models::make_model(c.model, sample_of(c.model), classes_of(c.model), 2, true);
    testing::EngineRun e(make_engine(*m, spec_for(c)));
    auto data = batches_for(c.model, 6, 2, 3);
    data.push_back(batches_for(c.model, 4, 1, 4)[0]);  // a smaller last batch
    for (auto& b : data) e.train_step(b.x, b.y, 1e-3f);
    const auto before = alloc_stats();
    for (int rep = 0; rep < 2; ++rep)
      for (auto& b : data) e.train_step(b.x, b.y, 1e-3f);
    EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
  }
}

}  // namespace
}  // namespace fanout
