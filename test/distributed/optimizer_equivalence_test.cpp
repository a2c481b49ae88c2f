// AdamW (amsgrad, no decay on biases) with clipping by global norm, 20
// steps: DataParallel over cpu:2 and cpu:3, DDP over 2 processes, the
// hybrid 2 processes x 2 replicas and --accumulate 4 each equal one device
// on the same global batch; with split-invariant math, bit for bit. The
// norm is taken on the fully reduced gradient, so every configuration
// clips by the same coefficient (and the test checks that clipping acted).
#include <gtest/gtest.h>

#include "models/zoo/zoo.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/engine_factory.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 24;
constexpr double kMaxNorm = 0.24;
const Shape kSample{1, 28, 28};

optim::OptimizerOptions adamw() { return testing::test_adamw(2e-3f); }

struct Trajectory {
  Tensor params;
  std::vector<double> norms;
};

// `micro` micro-batches per step (accumulation), this process's rows
// [rank * rows / world, ...) of each; reduced with the last.
Trajectory train(EngineSpec spec, int rank, int world, int micro, const std::vector<testing::Batch>& data) {
  auto m = models::make_model("lenet", kSample, 10, 5);
  testing::EngineRun e(make_engine(*m, std::move(spec)), adamw());
  Trajectory r;
  const int64_t local = kBatch / world, piece = local / micro;
  for (const auto& b : data) {
    for (int k = 0; k < micro; ++k) {
      const int64_t begin = rank * local + k * piece;
      e->forward_backward(b.x.slice(begin, begin + piece), b.y.slice(begin, begin + piece), 1.0f / kBatch,
                          k == micro - 1);
    }
    r.norms.push_back(optim::clip_grad_norm(*e.opt, kMaxNorm));
    e.opt->step();
    e.opt->zero_grad();
  }
  r.params = m->arenas().params.to(Device::cpu());
  return r;
}

EngineSpec spec_for(const std::string& devices, bool split_invariant) {
  EngineSpec s;
  s.devices = parse_devices(devices);
  s.dp.math.split_invariant = split_invariant;
  s.dp.seed = 5;
  return s;
}

// DDP (or the hybrid, with several devices per rank) over `world` ranks as threads.
std::vector<Trajectory> train_ddp(const std::string& devices, int world, bool split_invariant,
                           const std::vector<testing::Batch>& data) {
  testing::TempDir dir;
  std::vector<Trajectory> runs(world);
  testing::run_ranks(world, [&](int r) {
    EngineSpec s = spec_for(devices, split_invariant);
    s.group = distributed::make_gloo_group({r, world, "file:" + dir.path(), "adamw", 60});
    runs[r] = train(std::move(s), r, world, 1, data);
  });
  return runs;
}

class OptimizerEquivalence : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Math, OptimizerEquivalence, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SplitInvariant" : "Default"; });

TEST_P(OptimizerEquivalence, AdamWWithClippingEqualsOneDevice) {
  const bool exact = GetParam();
  const auto data = testing::random_batches(kSample, kBatch, kSteps, 13);
  const Trajectory one = train(spec_for("cpu", exact), 0, 1, 1, data);
  int clipped = 0;
  for (double n : one.norms) clipped += n > kMaxNorm;
  EXPECT_GT(clipped, kSteps / 2) << "clipping should act in most steps";
  EXPECT_LT(clipped, kSteps) << "and not in every one";

  std::vector<std::pair<std::string, Trajectory>> runs;
  runs.emplace_back("DataParallel cpu:2", train(spec_for("cpu:2", exact), 0, 1, 1, data));
  runs.emplace_back("DataParallel cpu:3", train(spec_for("cpu:3", exact), 0, 1, 1, data));
  runs.emplace_back("accumulate 4", train(spec_for("cpu", exact), 0, 1, 4, data));
  const auto ddp = train_ddp("cpu", 2, exact, data);
  runs.emplace_back("DDP 2 processes, rank 0", ddp[0]);
  runs.emplace_back("DDP 2 processes, rank 1", ddp[1]);
  const auto hybrid = train_ddp("cpu:2", 2, exact, data);
  runs.emplace_back("hybrid 2x2, rank 0", hybrid[0]);
  runs.emplace_back("hybrid 2x2, rank 1", hybrid[1]);
  for (const auto& [name, r] : runs) {
    SCOPED_TRACE(name);
    ASSERT_EQ(r.norms.size(), one.norms.size());
    for (size_t s = 0; s < r.norms.size(); ++s) {
      if (exact) {
        ASSERT_EQ(r.norms[s], one.norms[s]) << "step " << s;
      } else {
        ASSERT_NEAR(r.norms[s], one.norms[s], 1e-5 * one.norms[s]) << "step " << s;
      }
    }
    if (exact) {
      EXPECT_TRUE(testing::same_bits(r.params, one.params));
    } else {
      EXPECT_LT(testing::max_rel_diff(r.params, one.params), 1e-5);
    }
  }
}

}  // namespace
}  // namespace fanout
