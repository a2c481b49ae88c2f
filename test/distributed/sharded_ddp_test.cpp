// ZeRO-1 under DDP and the hybrid (--shard-optimizer with --strategy ddp):
// one shard per replica of every process; each shard's gradient is reduced
// onto its replica (locally, then across processes onto its process),
// stepped there, and the updated ranges are gathered back everywhere.
// Ranks are threads over Gloo (a FileStore in a temp directory).
//  - SGD with momentum and AdamW, 20 steps: sharded equals unsharded on
//    the same processes and devices. Bit for bit over 2 processes and the
//    hybrid 2x2 (every element is a sum of two values, whatever order the
//    collective takes), and over 3 processes with split-invariant math
//    (exact float64 sums). Over 3 processes Gloo's reduce and all-reduce
//    add the three in different orders: within 1e-6 by norm (measured SGD
//    1.5e-8, AdamW 1.8e-7); element by element within 1e-6, or for AdamW
//    (whose division by the second moment's root magnifies a last-bit
//    difference of a near-zero gradient) no further from unsharded than
//    unsharded itself is from one device (measured: 1.1e-6 against 2.0e-6).
//  - Clipping by norm sums the shards' squares over every process;
//    accumulation and a replica sitting out a small batch: the same bound.
//  - Each of the hybrid's 4 replicas holds the state of its quarter alone.
//  - A checkpoint needs gather_state() on every rank first; then rank 0's
//    file is the unsharded one's bit for bit, and it resumes on 3
//    processes sharded and on one device unsharded exactly (split-invariant).
#include <gtest/gtest.h>

#include <cmath>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/sharded_optimizer.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

const Shape kSample{1, 28, 28};

struct RunSetup {
  std::string devices = "cpu";  // each process's
  int world = 1;
  bool shard = false;
  bool split_invariant = false;
  std::string model = "lenet";
  int micro = 1;         // micro-batches per step
  double max_norm = 0;   // clipping by norm when > 0
  bool grads = false;    // ZeRO-2 (--shard-grads)
  DType reduce = DType::F32;  // --grad-reduce-dtype
};

struct RankRun {
  std::unique_ptr<Module> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<optim::Optimizer> opt;
};

RankRun make_run(const RunSetup& s, const optim::OptimizerOptions& o, int rank, const std::string& rdzv) {
  RankRun r;
  r.model = models::make_model(s.model, kSample, 10, 5);
  EngineSpec spec;
  spec.devices = parse_devices(s.devices);
  spec.dp.shard_optimizer = s.shard || s.grads;
  spec.dp.shard_grads = s.grads;
  spec.dp.grad_reduce_dtype = s.reduce;
  spec.dp.bucket_bytes = 64 * 1024;  // several buckets, cut by the shard bounds
  spec.dp.math.split_invariant = s.split_invariant;
  spec.dp.seed = 5;
  if (s.world > 1) spec.group = distributed::make_gloo_group({rank, s.world, rdzv, "sharded", 60});
  r.engine = make_engine(*r.model, std::move(spec));
  r.opt = train::make_engine_optimizer(*r.engine, o);
  return r;
}

// This process's rows [rank * rows / world, ...) of each global batch.
void steps(RankRun& r, const RunSetup& s, int rank, const std::vector<testing::Batch>& data) {
  for (const auto& b : data) {
    const int64_t rows = b.x.size(0), local = rows / s.world, piece = local / s.micro;
    for (int k = 0; k < s.micro; ++k) {
      const int64_t begin = rank * local + k * piece, end = k == s.micro - 1 ? (rank + 1) * local : begin + piece;
      r.engine->forward_backward(b.x.slice(begin, end), b.y.slice(begin, end), 1.0f / rows, k == s.micro - 1);
    }
    if (s.max_norm > 0) optim::clip_grad_norm(*r.opt, s.max_norm);
    r.opt->step();
    r.opt->zero_grad();
  }
}

// Every rank's parameters after training (fn, when given, runs on each rank after).
std::vector<Tensor> train(const RunSetup& s, const optim::OptimizerOptions& o, const std::vector<testing::Batch>& data,
                          const std::function<void(RankRun&, int)>& fn = {}) {
  testing::TempDir dir;
  std::vector<Tensor> out(s.world);
  testing::run_ranks(s.world, [&](int rank) {
    RankRun r = make_run(s, o, rank, "file:" + dir.path());
    steps(r, s, rank, data);
    out[rank] = r.model->arenas().params.to(Device::cpu());
    if (fn) fn(r, rank);
  });
  return out;
}

class ShardedDdp : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedDdp, ::testing::Values("sgd", "adamw"));

optim::OptimizerOptions options_for(const std::string& kind) {
  return kind == "sgd" ? testing::test_sgd() : testing::test_adamw(2e-3f);
}

// Sharded against unsharded where the sums' order differs: within 1e-6 by
// norm (||a - b|| / ||b||), and element by element within 1e-6 or within
// what unsharded itself differs from one device (another order of the same sums).
void expect_close(const Tensor& sharded, const Tensor& unsharded, const Tensor& one_device) {
  const double d = testing::max_rel_diff(sharded, unsharded), ref = testing::max_rel_diff(unsharded, one_device);
  EXPECT_LT(d, std::max(1e-6, ref)) << "unsharded vs one device: " << ref;
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < unsharded.numel(); ++i) {
    diff += std::pow(double(sharded.f32()[i]) - unsharded.f32()[i], 2);
    norm += std::pow(double(unsharded.f32()[i]), 2);
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-6) << "by norm";
}

TEST_P(ShardedDdp, EqualsUnshardedOverProcessesAndTheHybrid) {
  const auto o = options_for(GetParam());
  const auto data = testing::random_batches(kSample, 24, 20, 21);
  struct Case {
    const char* name;
    RunSetup s;
    bool exact;
  };
  const std::vector<Case> cases = {
      {"DDP 2 processes", {"cpu", 2}, true},
      {"DDP 3 processes", {"cpu", 3}, false},
      {"DDP 3 processes, split-invariant", {"cpu", 3, false, true}, true},
      {"hybrid 2x2", {"cpu:2", 2}, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RunSetup sharded = c.s;
    sharded.shard = true;
    const auto want = train(c.s, o, data), got = train(sharded, o, data);
    for (int r = 0; r < c.s.world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      if (c.exact) {
        EXPECT_TRUE(testing::same_bits(got[r], want[r]));
      } else {
        expect_close(got[r], want[r], train(RunSetup{"cpu"}, o, data)[0]);
      }
      EXPECT_TRUE(testing::same_bits(got[r], got[0])) << "every rank holds the same parameters";
    }
  }
}

// --grad-reduce-dtype bf16: a piece owned by a process's second replica
// travels as bfloat16 like the others (it went as float32 from its owner's
// process and as bfloat16 from the others' primaries: Gloo aborted).
TEST_P(ShardedDdp, BfloatReductionOnTheHybridEqualsUnsharded) {
  const auto o = options_for(GetParam());
  const auto data = testing::random_batches(kSample, 24, 6, 24);
  RunSetup plain{"cpu:2", 2};
  plain.reduce = DType::BF16;
  RunSetup sharded = plain, grads = plain;
  sharded.shard = true;
  grads.grads = true;
  const auto want = train(plain, o, data), got = train(sharded, o, data), got2 = train(grads, o, data);
  const auto f32 = train(RunSetup{"cpu:2", 2}, o, data);
  EXPECT_FALSE(testing::same_bits(want[0], f32[0])) << "the reduction ran in bfloat16";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(testing::same_bits(got[r], want[r])) << "--shard-optimizer";
    EXPECT_TRUE(testing::same_bits(got2[r], want[r])) << "--shard-grads";
  }
}

TEST_P(ShardedDdp, ClippingAccumulationAndASmallBatchEqualUnsharded) {
  const auto o = options_for(GetParam());
  auto data = testing::random_batches(kSample, 24, 6, 22);
  // 8 rows: 4 per process on 3 replicas (2 + 2): each process's third replica sits out.
  data.push_back(testing::random_batches(kSample, 8, 1, 23)[0]);
  RunSetup plain{"cpu:3", 2};
  plain.max_norm = 0.2;
  RunSetup sharded = plain, one{"cpu"};
  sharded.shard = true;
  one.max_norm = 0.2;
  expect_close(train(sharded, o, data)[1], train(plain, o, data)[1], train(one, o, data)[0]);
  plain.max_norm = sharded.max_norm = one.max_norm = 0;
  plain.micro = sharded.micro = 2;
  expect_close(train(sharded, o, data)[0], train(plain, o, data)[0], train(one, o, data)[0]);
}

TEST_P(ShardedDdp, EachReplicaOfEveryProcessHoldsItsShardsStateAlone) {
  RunSetup s{"cpu:2", 2};
  s.shard = true;
  std::vector<std::vector<int64_t>> held(2);
  int64_t total = 0;
  train(s, options_for(GetParam()), testing::random_batches(kSample, 24, 1, 24), [&](RankRun& r, int rank) {
    auto& opt = static_cast<train::ShardedOptimizer&>(*r.opt);
    if (rank == 0) total = r.model->arenas().params.numel();
    for (int i = 0; i < opt.num_shards(); ++i) held[rank].push_back(opt.shard(i).state()[0].second->numel());
  });
  int64_t sum = 0;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(held[rank].size(), 2u);
    for (int64_t h : held[rank]) {
      EXPECT_LE(h, (total + 3) / 4 + kArenaAlign) << "rank " << rank;
      sum += h;
    }
  }
  EXPECT_EQ(sum, total) << "the 4 shards cover the arena once";
}

// ZeRO-2 under DDP and the hybrid: each replica's gradient arena is its
// shard; other processes' sums leave the primary after every pass (also
// under no_sync). In split-invariant math bit for bit ZeRO-1 with
// accumulation, clipping and a replica sitting out, and bit for bit
// unsharded; in float32 bit for bit unsharded one micro-batch a step over 2
// processes (each element a sum of two values). Each of the hybrid 2x2's
// replicas keeps a quarter of resnet18's gradients and the buckets that
// quarter shares with its neighbours.
TEST_P(ShardedDdp, ShardedGradsEqualShardedOptimizerAndUnsharded) {
  const auto o = options_for(GetParam());
  auto data = testing::random_batches(kSample, 24, 5, 26);
  data.push_back(testing::random_batches(kSample, 8, 1, 27)[0]);  // cpu:3 x 2: each process's third replica sits out
  for (const RunSetup& base : {RunSetup{"cpu", 2}, RunSetup{"cpu:2", 2}, RunSetup{"cpu:3", 2}}) {
    SCOPED_TRACE(base.devices + " x 2 processes");
    RunSetup si = base;
    si.model = "mlp";
    si.split_invariant = true;
    si.micro = 2;
    RunSetup z1 = si, z2 = si;
    z1.shard = true;
    z2.grads = true;
    EXPECT_TRUE(testing::same_bits(train(z2, o, data)[1], train(si, o, data)[1]));
    z1.max_norm = z2.max_norm = 0.2;
    const auto got = train(z2, o, data), want = train(z1, o, data);
    for (int r = 0; r < 2; ++r) EXPECT_TRUE(testing::same_bits(got[r], want[r])) << "rank " << r;
  }
  RunSetup plain{"cpu", 2}, z2{"cpu", 2};
  z2.grads = true;
  EXPECT_TRUE(testing::same_bits(train(z2, o, data)[0], train(plain, o, data)[0]));
  RunSetup hybrid{"cpu:2", 2};
  hybrid.grads = true;
  hybrid.model = "resnet18";
  train(hybrid, o, {data[0]}, [&](RankRun& r, int rank) {
    const int64_t total = r.model->arenas().params.numel();
    int64_t largest = 0;
    for (auto& [n, p] : r.model->named_parameters()) largest = std::max(largest, p->shape.numel());
    // A quarter, and the buckets (64 KiB, or one larger parameter) it shares with its neighbours.
    const int64_t bound = (total + 3) / 4 + kArenaAlign + 2 * (64 * 1024 / 4 + largest);
    for (const Replica& rep : r.engine->replicas()) {
      EXPECT_LE(rep.model->arenas().grads.numel(), bound) << "rank " << rank;
      EXPECT_LT(rep.model->arenas().grads.numel(), total) << "rank " << rank;
    }
  });
}

TEST(ShardedDdpCheckpoint, GathersOnEveryRankThenSavesTheUnshardedFileAndResumesAnywhere) {
  testing::TempDir dir;
  const auto o = testing::test_adamw(2e-3f);
  const auto data = testing::random_batches(kSample, 24, 10, 25);
  const std::vector<testing::Batch> first(data.begin(), data.begin() + 5), rest(data.begin() + 5, data.end());
  RunSetup one{"cpu"};
  one.model = "mlp";
  one.split_invariant = true;
  const Tensor want = train(one, o, data)[0];
  // One device unsharded, 5 steps: the file to match.
  const std::string plain = dir.path() + "/plain.safetensors", sharded = dir.path() + "/sharded.safetensors";
  train(one, o, first, [&](RankRun& r, int) { train::save_checkpoint(plain, *r.engine, r.opt.get(), {}); });
  RunSetup ddp = one;
  ddp.world = 2;
  ddp.shard = true;
  train(ddp, o, first, [&](RankRun& r, int rank) {
    if (rank == 1) {
      // Without the gather, rank 1's copy of rank 0's shard is not there: refused.
      EXPECT_THROW(train::save_checkpoint(dir.path() + "/early.safetensors", *r.engine, r.opt.get(), {}), fanout::Error);
    }
    r.opt->gather_state();
    if (rank == 0) train::save_checkpoint(sharded, *r.engine, r.opt.get(), {});
  });
  const io::TensorFile fs = io::load_safetensors(sharded), fp = io::load_safetensors(plain);
  ASSERT_EQ(fs.tensors.size(), fp.tensors.size());
  int states = 0;
  for (size_t i = 0; i < fp.tensors.size(); ++i) {
    ASSERT_EQ(fs.tensors[i].first, fp.tensors[i].first);
    EXPECT_TRUE(testing::same_bits(fs.tensors[i].second, fp.tensors[i].second)) << fp.tensors[i].first;
    states += fp.tensors[i].first.rfind("optimizer.", 0) == 0;
  }
  EXPECT_GT(states, 0);
  // Resumed sharded over 3 processes (6 shards of the hybrid 3x2) and unsharded on one device.
  RunSetup three = ddp;
  three.world = 3;
  three.devices = "cpu:2";
  for (const RunSetup& s : {three, one}) {
    SCOPED_TRACE(s.world == 3 ? "hybrid 3x2 sharded" : "one device");
    testing::TempDir rdzv;
    std::vector<Tensor> got(s.world);
    testing::run_ranks(s.world, [&](int rank) {
      RankRun r = make_run(s, o, rank, "file:" + rdzv.path());
      train::load_checkpoint(sharded, *r.engine, *r.opt);
      EXPECT_EQ(r.opt->steps(), 5);
      steps(r, s, rank, rest);
      got[rank] = r.model->arenas().params.to(Device::cpu());
    });
    for (const Tensor& t : got) EXPECT_TRUE(testing::same_bits(t, want));
  }
}

}  // namespace
}  // namespace fanout
