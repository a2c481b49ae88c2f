// DataParallel, SyncBatchNorm, checkpoints and resume on CUDA devices. One
// GPU is enough: a repeated device (0,0) runs the multi-replica paths (p2p
// communicator, one stream per replica). TF32 is off throughout, so CUDA
// results are compared with float32 tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "cuda/target_batch.h"
#include "models/zoo/zoo.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "runtime/optim/clip.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/sharded_optimizer.h"
#include "support/dist_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using cudatest::gpu;
using testing::random_labels;
using testing::random_tensor;
using testing::random_batches;

Tensor host_params(Engine& eng) {
  eng.primary_context().compute().synchronize();
  return eng.model().arenas().params.to(Device::cpu());
}
Tensor host_buffers(Engine& eng) {
  eng.primary_context().compute().synchronize();
  return eng.model().arenas().buffers.to(Device::cpu());
}

// ||a - b|| / ||b|| over float tensors; b must not be all zeros.
double norm_rel(const Tensor& a, const Tensor& b) {
  double d = 0, n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    d += std::pow(double(a.f32()[i]) - b.f32()[i], 2);
    n += std::pow(double(b.f32()[i]), 2);
  }
  EXPECT_GT(n, 0.0);
  return std::sqrt(d / n);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<Device> repeated_gpu(int n) { return std::vector<Device>(n, gpu()); }

// One device and DataParallel over `n` copies of cuda:0 train the same model
// from the same weights on the same batches. Compared: the change each made
// to the parameters (sharper than the parameters themselves, which the
// updates barely move) and the BatchNorm running statistics, within float32
// rounding; and the losses.
void check_dp_matches_one_gpu(const std::string& model, const Shape& sample, int n, DataParallelOptions opts,
                              int steps, double rtol) {
  SCOPED_TRACE(::testing::Message() << model << " on " << n << " replicas, sync_bn " << opts.sync_bn
                                    << ", cudnn_benchmark " << opts.math.cudnn_benchmark);
  const auto data = random_batches(sample, 12, steps, 21);
  auto m1 = models::make_model(model, sample, 10, 7);
  auto mn = models::make_model(model, sample, 10, 7);
  const Tensor init = m1->arenas().params.to(Device::cpu());
  testing::Trained<SingleDeviceEngine> one(*m1, gpu(), *make_criterion({}), 7, opts.math);
  testing::Trained<DataParallelEngine> dp(*mn, repeated_gpu(n), *make_criterion({}), opts);
  for (const auto& b : data) {
    const StepResult r1 = one.train_step(b.x, b.y, 0.05f);
    const StepResult rn = dp.train_step(b.x, b.y, 0.05f);
    EXPECT_EQ(rn.count, r1.count);
    EXPECT_NEAR(rn.loss_sum, r1.loss_sum, 1e-4 * std::abs(r1.loss_sum));
  }
  auto delta = [&](Engine& e) {
    Tensor d = host_params(e);
    for (int64_t i = 0; i < d.numel(); ++i) d.f32()[i] -= init.f32()[i];
    return d;
  };
  EXPECT_LE(norm_rel(delta(dp), delta(one)), rtol) << "parameter updates";
  if (mn->arenas().buffers.numel() > 0) {
    const Tensor b1 = host_buffers(one), bn = host_buffers(dp);
    // Float buffers only (running mean and variance); counters are int64.
    double d = 0, s = 0;
    for (const auto& [name, buf] : mn->named_buffers()) {
      if (buf->dtype != DType::F32) continue;
      const Tensor a = bn.flat(buf->offset, buf->shape), w = b1.flat(buf->offset, buf->shape);
      for (int64_t i = 0; i < w.numel(); ++i) {
        d += std::pow(double(a.f32()[i]) - w.f32()[i], 2);
        s += std::pow(double(w.f32()[i]), 2);
      }
    }
    ASSERT_GT(s, 0.0);
    EXPECT_LE(std::sqrt(d / s), rtol) << "BatchNorm running statistics";
  }
  const StepResult e1 = one.eval_step(data[0].x, data[0].y), en = dp.eval_step(data[0].x, data[0].y);
  EXPECT_NEAR(en.loss_sum, e1.loss_sum, 1e-4 * std::abs(e1.loss_sum));
}

TEST(CudaDataParallel, TwoReplicasOnOneGpuMatchOneDevice) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_dp_matches_one_gpu("lenet", Shape{1, 28, 28}, 2, {}, 3, 1e-4);
}

TEST(CudaDataParallel, ThreeReplicasOnOneGpuMatchOneDevice) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_dp_matches_one_gpu("lenet", Shape{1, 28, 28}, 3, {}, 3, 1e-4);
}

// --shard-optimizer on GPUs: DataParallel over 0,0 and 0,0,0 (the p2p
// communicator reducing each piece onto its owner, sums formed in rank order
// whatever the owner) and DDP over 2 ranks sharing cuda:0 through Gloo (host
// staging of the reduce and the range broadcasts), AdamW with clipping, 8
// steps: sharded equals unsharded on the same devices. Deterministic cuDNN
// algorithms; the last batch leaves a replica out (its shard's sum passes
// through the primary). Within 1e-6 (the shards' squared norms are summed
// in another order than the whole arena's).
Tensor train_sharded_or_not(const std::vector<Device>& devices, bool shard, int rank, int world,
                            const std::string& rdzv) {
  auto m = models::make_model("lenet", Shape{1, 28, 28}, 10, 7);
  EngineSpec spec;
  spec.devices = devices;
  spec.force_data_parallel = true;
  spec.dp.shard_optimizer = shard;
  spec.dp.bucket_bytes = 64 * 1024;
  spec.dp.math.deterministic = true;
  if (world > 1) spec.group = distributed::make_gloo_group({rank, world, rdzv, "cuda-sharded", 60});
  auto e = make_engine(*m, std::move(spec));
  auto opt = train::make_engine_optimizer(*e, testing::test_adamw(2e-3f));
  EXPECT_EQ(e->sharding() ? e->sharding()->shards().size() : 0u, shard ? devices.size() : 0u);
  auto data = random_batches(Shape{1, 28, 28}, 12, 7, 31);
  data.push_back(random_batches(Shape{1, 28, 28}, 2 * world, 1, 32)[0]);  // 2 rows per rank
  for (const auto& b : data) {
    const int64_t local = b.x.size(0) / world;
    e->forward_backward(b.x.slice(rank * local, (rank + 1) * local), b.y.slice(rank * local, (rank + 1) * local),
                        1.0f / b.x.size(0), true);
    optim::clip_grad_norm(*opt, 0.3);
    opt->step();
    opt->zero_grad();
  }
  return host_params(*e);
}

TEST(CudaDataParallel, ShardedOptimizerEqualsUnsharded) {
  FANOUT_SKIP_WITHOUT_GPU();
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " replicas on cuda:0");
    const Tensor want = train_sharded_or_not(repeated_gpu(n), false, 0, 1, "");
    const Tensor got = train_sharded_or_not(repeated_gpu(n), true, 0, 1, "");
    EXPECT_LT(testing::max_rel_diff(got, want), 1e-6);
  }
  SCOPED_TRACE("DDP over 2 ranks on cuda:0, Gloo");
  std::vector<Tensor> want(2), got(2);
  for (bool shard : {false, true}) {
    testing::TempDir dir;
    testing::run_ranks(2, [&](int r) {
      (shard ? got : want)[r] = train_sharded_or_not({gpu()}, shard, r, 2, "file:" + dir.path());
    });
  }
  for (int r = 0; r < 2; ++r) EXPECT_LT(testing::max_rel_diff(got[r], want[r]), 1e-6) << "rank " << r;
}

// bf16-mixed DataParallel over 0,0. Its update is the mean of what one
// device makes of each half of the batch: the same cuDNN and cuBLAS calls on
// the same 4 rows (deterministic algorithms; BatchNorm's statistics are the
// half's either way), the loss gradient scaled by exactly 1/2 (which
// commutes with every rounding to bfloat16), so only float32 rounding in the
// reduction and the update parts them (1e-3 by norm). Against DataParallel
// over cpu:2 only losses are compared (8 u, u = 2^-9): gradients
// are not, as cuDNN's bf16 kernels put some outputs on the other bf16
// neighbour (ConvOnBackend.LowPrecisionAgainstRoundedOperands) and gradients
// on random batches turn on ReLU and max-pool decisions that close: on the
// CPU alone, inputs moved by one bf16 unit roundoff move lenet's first
// update by 1.6-3.1% in bf16-mixed (1.3-6.2% in float32); an H100 against
// cpu:2 moved it by 7.1%.
void check_bf16_dp_is_the_mean_of_its_halves(const std::string& model, const Shape& sample) {
  SCOPED_TRACE(model);
  std::mt19937_64 rng(23);
  const cudatest::TargetBatch b = cudatest::make_batch(model, sample, 8, rng);
  DataParallelOptions opts;
  opts.math.autocast = DType::BF16;
  opts.math.deterministic = true;
  auto mp = models::make_model(model, sample, b.classes, 7);
  const Tensor init = mp->arenas().params.to(Device::cpu());
  testing::Trained<DataParallelEngine> dp(*mp, repeated_gpu(2), *make_criterion(b.loss), opts);
  const StepResult rd = dp.train_step(b.x, b.y, 0.05f);
  Tensor want = Tensor::zeros(init.shape());
  double half_losses = 0;
  for (int h = 0; h < 2; ++h) {
    auto m = models::make_model(model, sample, b.classes, 7);
    testing::Trained<SingleDeviceEngine> one(*m, gpu(), *make_criterion(b.loss), 7, opts.math);
    half_losses += one.train_step(b.x.slice(4 * h, 4 * h + 4), b.y.slice(4 * h, 4 * h + 4), 0.05f).loss_sum;
    const Tensor p = host_params(one);
    for (int64_t i = 0; i < want.numel(); ++i) want.f32()[i] += 0.5f * (p.f32()[i] - init.f32()[i]);
  }
  EXPECT_NEAR(rd.loss_sum, half_losses, 1e-5 * std::abs(half_losses));
  Tensor got = host_params(dp);
  for (int64_t i = 0; i < got.numel(); ++i) got.f32()[i] -= init.f32()[i];
  EXPECT_LE(norm_rel(got, want), 1e-3) << "parameter update of step 1";
}

// The losses of two steps (the second after each side's own update) of
// bf16-mixed DataParallel over 0,0 and over cpu:2, at 8 u.
void check_bf16_dp_losses_match_the_cpu(const std::string& model, const Shape& sample) {
  SCOPED_TRACE(model);
  const double u = std::ldexp(1.0, -9);
  std::mt19937_64 rng(29);
  DataParallelOptions opts;
  opts.math.autocast = DType::BF16;
  const cudatest::TargetBatch b0 = cudatest::make_batch(model, sample, 8, rng);
  const cudatest::TargetBatch b1 = cudatest::make_batch(model, sample, 8, rng);
  auto mg = models::make_model(model, sample, b0.classes, 7);
  auto mc = models::make_model(model, sample, b0.classes, 7);
  testing::Trained<DataParallelEngine> gpus(*mg, repeated_gpu(2), *make_criterion(b0.loss), opts);
  testing::Trained<DataParallelEngine> cpu(*mc, parse_devices("cpu:2"), *make_criterion(b0.loss), opts);
  int step = 0;
  for (const cudatest::TargetBatch* b : {&b0, &b1}) {
    const StepResult rg = gpus.train_step(b->x, b->y, 0.05f);
    const StepResult rc = cpu.train_step(b->x, b->y, 0.05f);
    EXPECT_NEAR(rg.loss_sum, rc.loss_sum, 8 * u * std::abs(rc.loss_sum)) << "loss at step " << ++step;
  }
}

TEST(CudaDataParallel, Bf16MixedUpdateIsTheMeanOfItsHalves) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_bf16_dp_is_the_mean_of_its_halves("lenet", Shape{1, 28, 28});
  check_bf16_dp_is_the_mean_of_its_halves("resnet18", Shape{3, 16, 16});
  check_bf16_dp_is_the_mean_of_its_halves("heatmap3d", Shape{1, 8, 12, 8});
  check_bf16_dp_losses_match_the_cpu("lenet", Shape{1, 28, 28});
  check_bf16_dp_losses_match_the_cpu("heatmap3d", Shape{1, 8, 12, 8});
}

// Per-replica BatchNorm differs from one device by design; SyncBatchNorm
// normalizes with the whole batch's statistics, as one device does.
TEST(CudaDataParallel, SyncBatchNormOnTwoReplicasMatchesOneDevice) {
  FANOUT_SKIP_WITHOUT_GPU();
  DataParallelOptions opts;
  opts.sync_bn = true;
  check_dp_matches_one_gpu("resnet18", Shape{3, 16, 16}, 2, opts, 1, 1e-4);
}

// cuDNN's algorithm search runs per replica context; two replicas sharing
// one GPU must each get a plan and train like one device.
TEST(CudaDataParallel, CudnnBenchmarkWithTwoReplicasOnOneGpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  DataParallelOptions opts;
  opts.sync_bn = true;
  opts.math.cudnn_benchmark = true;
  check_dp_matches_one_gpu("resnet18", Shape{3, 16, 16}, 2, opts, 1, 1e-4);
}

// heatmap3d (Conv3d, BatchNorm3d, MaxPool3d, Upsample3d) with MSE on dense
// targets, 3 steps of 10 volumes 8x8x8 with 3 landmarks; deterministic
// cuDNN algorithms, so that two runs differ only by their loss path.
struct HeatmapRun {
  std::vector<StepResult> train;
  std::vector<int64_t> bytes;  // to the primary, per step (DataParallel only)
  Tensor delta;                // the parameters' change
};

HeatmapRun run_heatmap3d(int replicas, bool on_replicas, bool sync_bn) {
  const Shape sample{1, 8, 8, 8};
  const int landmarks = 3;
  std::mt19937_64 rng(41);
  auto m = models::make_model("heatmap3d", sample, landmarks, 9);
  const Tensor init = m->arenas().params.to(Device::cpu());
  const LossOptions mse{CriterionKind::Mse, 0.0f};
  MathOptions math;
  math.deterministic = true;
  testing::EngineRun eng;
  DataParallelEngine* dp = nullptr;
  if (replicas == 1) {
    eng = testing::EngineRun(std::make_unique<SingleDeviceEngine>(*m, gpu(), *make_criterion(mse), 9, math));
  } else {
    DataParallelOptions opts;
    opts.loss_on_replicas = on_replicas;
    opts.sync_bn = sync_bn;
    opts.math = math;
    auto e = std::make_unique<DataParallelEngine>(*m, repeated_gpu(replicas), *make_criterion(mse), opts);
    dp = e.get();
    eng = testing::EngineRun(std::move(e));
  }
  HeatmapRun r;
  for (int s = 0; s < 3; ++s) {
    const Tensor x = random_tensor(Shape{10, 1, 8, 8, 8}, rng);
    const Tensor y = testing::random_heatmaps(Shape{10, landmarks, 8, 8, 8}, rng);
    r.train.push_back(eng.train_step(x, y, 0.05f));
    r.bytes.push_back(dp ? dp->bytes_to_primary() : 0);
  }
  r.delta = host_params(*eng.engine);
  for (int64_t i = 0; i < r.delta.numel(); ++i) r.delta.f32()[i] -= init.f32()[i];
  return r;
}

void expect_same_heatmap_steps(const HeatmapRun& got, const HeatmapRun& want, double rtol) {
  ASSERT_EQ(got.train.size(), want.train.size());
  for (size_t i = 0; i < want.train.size(); ++i) {
    EXPECT_NEAR(got.train[i].loss_sum, want.train[i].loss_sum, rtol * std::abs(want.train[i].loss_sum)) << "step " << i;
    EXPECT_EQ(got.train[i].count, want.train[i].count);
    EXPECT_EQ(got.train[i].sums[kPointsSum].value(), 30);  // every (row, landmark) has a peak
  }
  EXPECT_LE(norm_rel(got.delta, want.delta), rtol) << "parameter updates";
}

// The loss on the replicas (each replica's MSE and argmax planes on its own
// stream, per-replica target copies) against the gathered outputs on two
// replicas of cuda:0: the same steps, and only scalars reach the primary.
// With SyncBatchNorm both equal one device.
TEST(CudaDataParallel, HeatmapLossOnReplicasMatchesGatheredAndOneDevice) {
  FANOUT_SKIP_WITHOUT_GPU();
  const HeatmapRun local = run_heatmap3d(2, true, false), gathered = run_heatmap3d(2, false, false);
  expect_same_heatmap_steps(local, gathered, 1e-5);
  // Replica 1 holds 5 of the 10 rows: their losses and, per (row, landmark), the argmax of
  // output and target (index and value each), against their outputs and targets gathered.
  EXPECT_EQ(local.bytes[0], 5 * 4 + 5 * 3 * 16);
  EXPECT_EQ(gathered.bytes[0], 5 * 3 * 512 * 4 * 2);

  const HeatmapRun one = run_heatmap3d(1, true, false);
  expect_same_heatmap_steps(run_heatmap3d(2, true, true), one, 1e-4);
  expect_same_heatmap_steps(run_heatmap3d(2, false, true), one, 1e-4);
}

// The change one training step makes to the parameters.
Tensor one_step_delta(const std::vector<Device>& devices, const MathOptions& math) {
  const Shape sample{3, 16, 16};
  const auto data = random_batches(sample, 12, 1, 21);
  auto m = models::make_model("resnet18", sample, 10, 7);
  const Tensor init = m->arenas().params.to(Device::cpu());
  testing::EngineRun eng;
  if (devices.size() == 1) {
    eng = testing::EngineRun(std::make_unique<SingleDeviceEngine>(*m, devices[0], *make_criterion({}), 7, math));
  } else {
    DataParallelOptions opts;
    opts.sync_bn = true;
    opts.math = math;
    eng = testing::EngineRun(std::make_unique<DataParallelEngine>(*m, devices, *make_criterion({}), opts));
  }
  eng.train_step(data[0].x, data[0].y, 0.05f);
  Tensor d = host_params(*eng.engine);
  for (int64_t i = 0; i < d.numel(); ++i) d.f32()[i] -= init.f32()[i];
  return d;
}

// TF32 with whatever algorithms the timed search finds fastest (a replica's
// 6 rows may get other ones than 12 rows): two replicas stay as close to the
// float32 step as one device with the same settings does, up to a factor 2.
// TF32's own error sets the scale (about 5% of a resnet18 step here), so the
// bound is relative to it, not a fixed number.
TEST(CudaDataParallel, CudnnBenchmarkWithTf32OnTwoReplicas) {
  FANOUT_SKIP_WITHOUT_GPU();
  MathOptions fp32, tf32;
  tf32.allow_tf32 = true;
  tf32.cudnn_benchmark = true;
  const Tensor ref = one_step_delta({gpu()}, fp32);
  const double one = norm_rel(one_step_delta({gpu()}, tf32), ref);
  const double two = norm_rel(one_step_delta(repeated_gpu(2), tf32), ref);
  ::testing::Test::RecordProperty("tf32_one_device", std::to_string(one));
  ::testing::Test::RecordProperty("tf32_two_replicas", std::to_string(two));
  EXPECT_GT(one, 0.0) << "TF32 changed nothing: is it on?";
  EXPECT_LE(one, 0.2);
  EXPECT_LE(two, 2 * one + 1e-3) << "one device with TF32: " << one;
}

// A checkpoint holds host tensors: written from one device kind, it loads
// into a model on the other, bit for bit (parameters, buffers and every
// optimizer state arena), and the next steps' updates agree: one update
// barely moves the parameters, so the updates themselves are compared
// (a lost momentum buffer changes them by its whole weight).
void check_checkpoint_crosses(Device from, Device to) {
  SCOPED_TRACE(from.str() + " -> " + to.str());
  testing::TempDir dir;
  const std::string path = dir.path() + "/ckpt.safetensors";
  const Shape sample{3, 16, 16};
  const auto data = random_batches(sample, 6, 3, 31);
  auto ma = models::make_model("resnet18", sample, 10, 3);
  auto mb = models::make_model("resnet18", sample, 10, 4);  // other initial weights: the load must replace them
  testing::Trained<SingleDeviceEngine> a(*ma, from, *make_criterion({}), 3);
  testing::Trained<SingleDeviceEngine> b(*mb, to, *make_criterion({}), 4);
  for (int s = 0; s < 2; ++s) a.train_step(data[s].x, data[s].y, 0.05f);
  train::CheckpointState st;
  st.epoch = 1;
  st.step = 2;
  train::save_checkpoint(path, a, &a.optimizer(), st);
  const train::CheckpointState got = train::load_checkpoint(path, b, b.optimizer());
  EXPECT_EQ(got.step, 2);
  EXPECT_EQ(b.optimizer().steps(), 2);
  EXPECT_TRUE(bit_equal(host_params(b), host_params(a)));
  EXPECT_TRUE(bit_equal(host_buffers(b), host_buffers(a)));
  const auto sa = a.optimizer().state(), sb = b.optimizer().state();
  ASSERT_EQ(sa.size(), 1u);
  ASSERT_EQ(sb.size(), 1u);
  EXPECT_EQ(sb[0].first, "momentum_buffer");
  EXPECT_TRUE(bit_equal(sb[0].second->to(Device::cpu()), sa[0].second->to(Device::cpu())));
  for (int s = 2; s < 3; ++s) {
    const Tensor pa = host_params(a), pb = host_params(b);
    a.train_step(data[s].x, data[s].y, 0.05f);
    b.train_step(data[s].x, data[s].y, 0.05f);  // uses the restored momentum buffers
    Tensor da = host_params(a), db = host_params(b);
    for (int64_t i = 0; i < da.numel(); ++i) {
      da.f32()[i] -= pa.f32()[i];
      db.f32()[i] -= pb.f32()[i];
    }
    EXPECT_LE(norm_rel(db, da), 1e-3) << "the update after the restore";
  }
}

TEST(CudaCheckpoint, WrittenOnGpuLoadsOnCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_checkpoint_crosses(gpu(), Device::cpu());
}

TEST(CudaCheckpoint, WrittenOnCpuLoadsOnGpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  check_checkpoint_crosses(Device::cpu(), gpu());
}

// Deterministic algorithms on one GPU: stopping after 2 steps, saving and
// resuming into a fresh engine gives the uninterrupted run's bits.
TEST(CudaCheckpoint, ResumeOnGpuEqualsUninterruptedRun) {
  FANOUT_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string path = dir.path() + "/ckpt.safetensors";
  const Shape sample{3, 16, 16};
  const auto data = random_batches(sample, 8, 4, 41);
  MathOptions math;
  math.deterministic = true;
  auto mu = models::make_model("resnet18", sample, 10, 5);
  testing::Trained<SingleDeviceEngine> full(*mu, gpu(), *make_criterion({}), 5, math);
  for (const auto& b : data) full.train_step(b.x, b.y, 0.05f);
  {
    auto mi = models::make_model("resnet18", sample, 10, 5);
    testing::Trained<SingleDeviceEngine> first(*mi, gpu(), *make_criterion({}), 5, math);
    for (int s = 0; s < 2; ++s) first.train_step(data[s].x, data[s].y, 0.05f);
    train::CheckpointState st;
    st.step = 2;
    train::save_checkpoint(path, first, &first.optimizer(), st);
  }
  auto mr = models::make_model("resnet18", sample, 10, 6);
  testing::Trained<SingleDeviceEngine> resumed(*mr, gpu(), *make_criterion({}), 6, math);
  train::load_checkpoint(path, resumed, resumed.optimizer());
  for (int s = 2; s < 4; ++s) resumed.train_step(data[s].x, data[s].y, 0.05f);
  EXPECT_TRUE(bit_equal(host_params(resumed), host_params(full)));
  EXPECT_TRUE(bit_equal(host_buffers(resumed), host_buffers(full)));
}

}  // namespace
}  // namespace fanout
