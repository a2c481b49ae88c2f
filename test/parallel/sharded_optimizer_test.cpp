// ZeRO-1 over DataParallel's CPU replicas (--shard-optimizer): each replica
// steps the optimizer of one range of the arena, on its own thread.
//  - SGD with momentum and AdamW (groups, amsgrad), 20 steps: sharded on
//    cpu:2 and cpu:3 (uneven ranges) equals unsharded on the same devices
//    bit for bit (every element is summed in the same order onto its owner
//    and updated by the same formula); with clipping by norm within 1e-6
//    (the shards' squares are summed in another order); a last batch smaller
//    than the device count, bit for bit; with accumulation within 1e-6 (an
//    owner adds its own micro-batches first), bit for bit in split-invariant math.
//  - Each replica holds the state of its range alone: at most ceil(P / N)
//    + 16 elements per state (P the arena), so the primary holds no more
//    than the others.
//  - A checkpoint saved sharded holds the unsharded optimizer's tensors
//    bit for bit, and resumes sharded over another replica count or
//    unsharded on one device exactly (split-invariant mlp).
#include <gtest/gtest.h>

#include <filesystem>

#include "models/zoo/zoo.h"
#include "runtime/core/memory.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/run_config.h"
#include "runtime/train/sharded_optimizer.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

const Shape kSample{1, 28, 28};

struct DpRun {
  std::unique_ptr<Module> model;
  std::unique_ptr<DataParallelEngine> engine;
  std::unique_ptr<optim::Optimizer> opt;
};

DpRun make_run(const std::string& devices, bool shard, const optim::OptimizerOptions& o, const std::string& model = "lenet",
             bool split_invariant = false, bool grads = false) {
  DpRun r;
  r.model = models::make_model(model, kSample, 10, 5);
  DataParallelOptions dpo;
  dpo.shard_optimizer = shard || grads;
  dpo.shard_grads = grads;
  dpo.bucket_bytes = 64 * 1024;  // several buckets, cut by the shard bounds
  dpo.math.split_invariant = split_invariant;
  r.engine = std::make_unique<DataParallelEngine>(*r.model, parse_devices(devices), *make_criterion({}), dpo);
  r.opt = train::make_engine_optimizer(*r.engine, o);
  return r;
}

// `micro` micro-batches per step; clipping by norm when max_norm > 0.
Tensor train(DpRun& r, const std::vector<testing::Batch>& data, int micro = 1, double max_norm = 0) {
  for (const auto& b : data) {
    const int64_t rows = b.x.size(0), piece = rows / micro;
    for (int k = 0; k < micro; ++k) {
      const int64_t end = k == micro - 1 ? rows : (k + 1) * piece;
      r.engine->forward_backward(b.x.slice(k * piece, end), b.y.slice(k * piece, end), 1.0f / rows, k == micro - 1);
    }
    if (max_norm > 0) optim::clip_grad_norm(*r.opt, max_norm);
    r.opt->step();
    r.opt->zero_grad();
  }
  return r.model->arenas().params.to(Device::cpu());
}

class ShardedOptimizerTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedOptimizerTest, ::testing::Values("sgd", "adamw"));

optim::OptimizerOptions options_for(const std::string& kind) {
  return kind == "sgd" ? testing::test_sgd() : testing::test_adamw(2e-3f);
}

TEST_P(ShardedOptimizerTest, EqualsUnshardedOnTwoAndThreeReplicas) {
  const auto o = options_for(GetParam());
  const auto data = testing::random_batches(kSample, 24, 20, 3);
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    SCOPED_TRACE(devices);
    DpRun plain = make_run(devices, false, o), sharded = make_run(devices, true, o);
    ASSERT_EQ(sharded.engine->sharding()->shards().size(), std::string(devices) == "cpu:2" ? 2u : 3u);
    EXPECT_TRUE(testing::same_bits(train(sharded, data), train(plain, data)));
    EXPECT_EQ(sharded.opt->steps(), 20);
  }
}

TEST_P(ShardedOptimizerTest, ClippingByNormIsTheWholeGradientsNorm) {
  const auto o = options_for(GetParam());
  const auto data = testing::random_batches(kSample, 24, 20, 4);
  DpRun plain = make_run("cpu:3", false, o), sharded = make_run("cpu:3", true, o);
  const Tensor want = train(plain, data, 1, 0.2), got = train(sharded, data, 1, 0.2);
  EXPECT_LT(testing::max_rel_diff(got, want), 1e-6);
}

TEST_P(ShardedOptimizerTest, AccumulationAndSmallBatchesEqualUnsharded) {
  const auto o = options_for(GetParam());
  auto data = testing::random_batches(kSample, 24, 6, 5);
  data.push_back(testing::random_batches(kSample, 4, 1, 6)[0]);  // 4 rows on 3 replicas (2 + 2): the third sits out
  DpRun plain = make_run("cpu:3", false, o), sharded = make_run("cpu:3", true, o);
  // Accumulating, an owner other than the primary adds its own micro-batches'
  // terms before the other replicas' (measured: SGD 1.5e-8, AdamW 1.8e-7).
  const Tensor want = train(plain, data, 3), got = train(sharded, data, 3);
  EXPECT_LT(testing::max_rel_diff(got, want), 1e-6);
  EXPECT_FALSE(testing::same_bits(want, models::make_model("lenet", kSample, 10, 5)->arenas().params));  // it trained
  // Split-invariant math sums in one order whoever owns a range: bit for bit.
  const auto mlp_data = testing::random_batches(kSample, 24, 6, 7);
  DpRun plain_si = make_run("cpu:3", false, o, "mlp", true), sharded_si = make_run("cpu:3", true, o, "mlp", true);
  EXPECT_TRUE(testing::same_bits(train(sharded_si, mlp_data, 3), train(plain_si, mlp_data, 3)));
  DpRun plain1 = make_run("cpu:3", false, o), sharded1 = make_run("cpu:3", true, o);
  EXPECT_TRUE(testing::same_bits(train(sharded1, data), train(plain1, data)));
}

TEST_P(ShardedOptimizerTest, EachReplicaHoldsItsRangesStateAlone) {
  const auto o = options_for(GetParam());
  for (int n : {2, 3}) {
    DpRun r = make_run("cpu:" + std::to_string(n), true, o);
    train(r, testing::random_batches(kSample, 12, 1, 7));
    auto& s = static_cast<train::ShardedOptimizer&>(*r.opt);
    const int64_t total = r.model->arenas().params.numel();
    int64_t sum = 0, primary = 0, least = total;
    for (int i = 0; i < s.num_shards(); ++i) {
      const auto st = s.shard(i).state();
      ASSERT_FALSE(st.empty());
      const int64_t held = st[0].second->numel();
      for (auto& [name, t] : st) EXPECT_EQ(t->numel(), held) << name;
      EXPECT_LE(held, (total + n - 1) / n + kArenaAlign) << "shard " << i;
      EXPECT_EQ(st[0].second->device(), r.engine->data_parallel().devices()[i]);
      sum += held;
      if (i == 0) primary = held;
      least = std::min(least, held);
    }
    EXPECT_EQ(sum, total) << "the shards cover the arena once";
    EXPECT_LE(primary, least + kArenaAlign);
  }
}

// What the epoch summary reports per CPU replica (arenas + optimizer state):
// the parameters once, on the primary (CPU replicas read its arena); sharded,
// the primary holds no more than the others besides them; unsharded, it
// holds the whole state on top.
TEST_P(ShardedOptimizerTest, ReplicaBytesAreBalancedWhenSharded) {
  for (bool shard : {false, true}) {
    DpRun r = make_run("cpu:3", shard, options_for(GetParam()));
    train(r, testing::random_batches(kSample, 12, 1, 10));
    const auto arenas = replica_arenas(*r.engine);
    const auto state = r.opt->state_bytes();
    ASSERT_EQ(arenas.size(), 3u);
    ASSERT_EQ(state.size(), shard ? 3u : 1u);
    int64_t total_state = 0;
    for (int64_t b : state) total_state += b;
    std::vector<int64_t> held(3);
    for (size_t i = 0; i < 3; ++i) held[i] = arenas[i].total() + (i < state.size() ? state[i] : 0);
    const int64_t others = std::min(held[1], held[2]);
    const int64_t params = static_cast<int64_t>(r.model->arenas().params.nbytes());
    for (int i = 1; i < 3; ++i) {
      Module& m = r.engine->data_parallel().replica(i);
      EXPECT_TRUE(m.shares_params_with(*r.model)) << "replica " << i;
      const Arenas& a = m.arenas();
      EXPECT_EQ(arenas[i].total(), static_cast<int64_t>(a.grads.nbytes() + (a.buffers.defined() ? a.buffers.nbytes() : 0)));
      EXPECT_EQ(arenas[i].params, 0);
    }
    if (shard) {
      EXPECT_LE(held[0] - params - others, static_cast<int64_t>(kArenaAlign * sizeof(float)) * 2);
      // Once a checkpoint has assembled the whole state, the primary holds that copy too.
      const auto names = r.opt->state_names();
      r.opt->state();
      EXPECT_EQ(r.opt->state_bytes()[0], state[0] + static_cast<int64_t>(names.size()) * params);
    } else {
      EXPECT_EQ(held[0] - params - others, total_state);
    }
  }
}

// Sharded optimizer and sharded gradients (whose blocks come from a pool
// that stops growing), a smaller last batch among the steps.
TEST_P(ShardedOptimizerTest, SteadyStateStepAllocatesNothing) {
  for (bool grads : {false, true}) {
    SCOPED_TRACE(grads ? "--shard-grads" : "--shard-optimizer");
    DpRun r = make_run("cpu:3", true, options_for(GetParam()), "lenet", false, grads);
    auto data = testing::random_batches(kSample, 12, 3, 9);
    data.push_back(testing::random_batches(kSample, 4, 1, 10)[0]);
    auto steps = [&] {
      for (const auto& b : data) {
        r.engine->forward_backward_batch(b.x, b.y);
        optim::clip_grad_norm(*r.opt, 0.5);
        r.opt->step();
        r.opt->zero_grad();
      }
    };
    steps();
    const auto before = alloc_stats();
    steps();
    EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
  }
}

// A sharded optimizer that outlives its engine (the sharding and the
// replicas' contexts) refuses to step instead of reading freed memory.
TEST(ShardedOptimizerLifetime, OutlivingTheEngineIsAnError) {
  DpRun r = make_run("cpu:2", true, testing::test_sgd());
  ASSERT_NE(dynamic_cast<train::ShardedOptimizer*>(r.opt.get()), nullptr);
  r.engine.reset();
  for (auto call : {+[](optim::Optimizer& o) { o.step(); }, +[](optim::Optimizer& o) { o.zero_grad(); },
                    +[](optim::Optimizer& o) { o.grad_sum_squares(); }})
    testing::expect_user_error([&] { call(*r.opt); }, {"the optimizer's context is gone"});
}

TEST(ShardedOptimizerCheckpoint, SavesTheUnshardedFileAndResumesOnAnyReplicaCount) {
  testing::TempDir dir;
  const auto o = testing::test_adamw(2e-3f);
  const auto data = testing::random_batches(kSample, 24, 10, 8);
  const std::vector<testing::Batch> first(data.begin(), data.begin() + 5), rest(data.begin() + 5, data.end());
  // Uninterrupted: sharded cpu:2, split-invariant (the same bits on any device count).
  DpRun whole = make_run("cpu:2", true, o, "mlp", true);
  const Tensor want = train(whole, data);
  // Sharded and unsharded runs of the first 5 steps save the same tensors.
  DpRun a = make_run("cpu:2", true, o, "mlp", true), b = make_run("cpu:2", false, o, "mlp", true);
  train(a, first);
  train(b, first);
  const std::string pa = dir.path() + "/sharded.safetensors", pb = dir.path() + "/plain.safetensors";
  train::save_checkpoint(pa, *a.engine, a.opt.get(), {});
  train::save_checkpoint(pb, *b.engine, b.opt.get(), {});
  const io::TensorFile fa = io::load_safetensors(pa), fb = io::load_safetensors(pb);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  int states = 0;
  for (size_t i = 0; i < fb.tensors.size(); ++i) {
    const auto& [name, t] = fb.tensors[i];
    ASSERT_EQ(fa.tensors[i].first, name);
    EXPECT_TRUE(testing::same_bits(fa.tensors[i].second, t)) << name;
    states += name.rfind("optimizer.", 0) == 0;
  }
  EXPECT_GT(states, 0);
  // The assembled copy is the checkpoint's: the next step frees it (ZeRO-1's memory again).
  auto& sa = static_cast<train::ShardedOptimizer&>(*a.opt);
  const int64_t own = sa.shard(0).state_bytes()[0], total = a.model->arenas().params.numel();
  const auto names = static_cast<int64_t>(sa.state_names().size());
  EXPECT_EQ(sa.state_bytes()[0], own + names * total * 4) << "every state tensor, assembled";
  train(a, {rest[0]});
  EXPECT_EQ(sa.state_bytes()[0], own);
  // Resumed unsharded on one device, and sharded over 3 replicas: the uninterrupted run's parameters.
  for (const char* devices : {"cpu", "cpu:3"}) {
    SCOPED_TRACE(devices);
    DpRun r = make_run(devices, std::string(devices) != "cpu", o, "mlp", true);
    train::load_checkpoint(pa, *r.engine, *r.opt);
    EXPECT_EQ(r.opt->steps(), 5);
    EXPECT_TRUE(testing::same_bits(train(r, rest), want));
  }
}

// ZeRO-2 (--shard-grads): each replica's gradient arena holds the buckets
// that meet its shard; the other buckets' gradients live in pooled blocks
// until they are reduced. The same sums in the same order onto the same
// owners as ZeRO-1:
//  - bit for bit ZeRO-1 on cpu:2 and cpu:3 with accumulation, clipping and
//    a replica sitting out a small batch, in float32 (lenet) and in
//    split-invariant math (mlp), and there bit for bit unsharded too;
//  - resnet18 (BatchNorm: no split-invariant math) bit for bit unsharded,
//    one micro-batch a step (both add the replicas' terms in rank order);
//  - each replica's gradient window at most ceil(P / N) plus the two
//    buckets it shares with its neighbours, its gradients in flight at most
//    two buckets, and the pool stops growing after the first step.
class ShardedGradsTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedGradsTest, ::testing::Values("sgd", "adamw"));

TEST_P(ShardedGradsTest, EqualsShardedOptimizerAndUnsharded) {
  const auto o = options_for(GetParam());
  auto data = testing::random_batches(kSample, 24, 6, 41);
  data.push_back(testing::random_batches(kSample, 4, 1, 42)[0]);  // on cpu:3 the third replica sits out
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    SCOPED_TRACE(devices);
    for (const char* model : {"mlp", "lenet"}) {
      SCOPED_TRACE(model);
      const bool si = std::string(model) == "mlp";
      for (const auto& [micro, norm] : std::vector<std::pair<int, double>>{{1, 0.0}, {3, 0.0}, {2, 0.2}}) {
        SCOPED_TRACE("micro " + std::to_string(micro) + ", clip " + std::to_string(norm));
        DpRun z1 = make_run(devices, true, o, model, si), z2 = make_run(devices, false, o, model, si, true);
        const Tensor got = train(z2, data, micro, norm);
        EXPECT_TRUE(testing::same_bits(got, train(z1, data, micro, norm)));
        if (si && norm == 0) {
          DpRun plain = make_run(devices, false, o, model, true);
          EXPECT_TRUE(testing::same_bits(got, train(plain, data, micro)));
        }
      }
    }
  }
}

TEST(ShardedGrads, Resnet18EqualsUnsharded) {
  const auto o = testing::test_sgd();
  const auto data = testing::random_batches(kSample, 6, 3, 43);
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    DpRun plain = make_run(devices, false, o, "resnet18"), z2 = make_run(devices, false, o, "resnet18", false, true);
    EXPECT_TRUE(testing::same_bits(train(z2, data), train(plain, data))) << devices;
  }
}

TEST(ShardedGrads, EachReplicaHoldsItsShardsGradientsAndStateAlone) {
  for (const char* model : {"lenet", "resnet18"}) {
    for (int n : {2, 3}) {
      SCOPED_TRACE(std::string(model) + " on cpu:" + std::to_string(n));
      DpRun r = make_run("cpu:" + std::to_string(n), false, testing::test_adamw(2e-3f), model, false, true);
      const auto data = testing::random_batches(kSample, 12, 4, 44);
      train(r, {data[0]});
      const std::vector<Replica> first = r.engine->replicas();
      train(r, {data.begin() + 1, data.end()});
      const int64_t total = r.model->arenas().params.numel(), share = (total + n - 1) / n + kArenaAlign;
      int64_t bucket = 0;  // the largest (a parameter larger than bucket_bytes is a bucket alone)
      for (const GradBucket& b : r.engine->data_parallel().buckets().buckets()) bucket = std::max(bucket, b.count);
      auto& s = static_cast<train::ShardedOptimizer&>(*r.opt);
      const std::vector<Replica> rs = r.engine->replicas();
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE("replica " + std::to_string(i));
        // The window: the shard and the buckets it shares with its neighbours.
        const int64_t window = rs[i].model->arenas().grads.numel(), pool = rs[i].grads_in_flight_bytes / 4;
        EXPECT_LE(window, share + 2 * bucket);
        EXPECT_LE(pool, 2 * bucket) << "gradients in flight";
        EXPECT_EQ(rs[i].grads_in_flight_bytes, first[i].grads_in_flight_bytes) << "the pool grew after the first step";
        EXPECT_LE(s.shard(i).state()[0].second->numel(), share);
        std::printf("%s cpu:%d replica %d: gradient elements %lld + %lld in flight of %lld (largest bucket %lld)\n",
                    model, n, i, static_cast<long long>(window), static_cast<long long>(pool),
                    static_cast<long long>(total), static_cast<long long>(bucket));
      }
    }
  }
}

TEST(ShardedOptimizerOptions, ShardsOnlyWhenAsked) {
  DataParallelOptions o;
  o.shard_optimizer = true;
  auto m1 = models::make_model("mlp", Shape{1, 4, 4}, 10, 1);
  DataParallelEngine sharded(*m1, parse_devices("cpu:2"), *make_criterion({}), o);
  ASSERT_NE(sharded.sharding(), nullptr);
  EXPECT_EQ(sharded.sharding()->shards().size(), 2u);
  auto m2 = models::make_model("mlp", Shape{1, 4, 4}, 10, 1);
  EXPECT_EQ(DataParallelEngine(*m2, parse_devices("cpu:2"), *make_criterion({})).sharding(), nullptr);
}

}  // namespace
}  // namespace fanout
