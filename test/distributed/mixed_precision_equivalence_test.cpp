// Mixed precision on every engine: lenet with SGD (momentum, weight decay)
// for 20 steps under bf16-mixed and 16-mixed (with a GradScaler):
// DataParallel over cpu:2, DDP over 2 processes and --accumulate 4 against
// one device on the same global batch.
//
// The tolerance comes from the low type's unit roundoff u (2^-8 for
// bfloat16, 2^-11 for float16). The forward pass reads every weight rounded
// to u relative, so runs whose weights differ by less than that are the same
// to it, and splitting the batch differently changes what is rounded at
// each documented point (outputs, dx and weight gradients per replica and
// micro-batch) by about u per rounding. The parameters after 20 steps must
// agree to ||p - p_one|| <= 3 u ||p_one|| for bfloat16 and 6 u for float16
// (measured: about 0.75 u and 3 u; float32 engines agree to about 1e-6), and
// the mixed run must be farther than 2^-11 from float32's (the rounding acts).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "models/zoo/zoo.h"
#include "runtime/optim/grad_scaler.h"
#include "runtime/parallel/engine_factory.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

constexpr int kSteps = 20;
constexpr int64_t kBatch = 24;
const Shape kSample{1, 28, 28};

struct Trajectory {
  Tensor params;
  float scale = 0;
  int64_t skipped = 0;
  int64_t summed_bytes = 0;  // DDP: what the rank put into summing collectives
  int64_t grad_elements = 0;
};

Trajectory train(EngineSpec spec, int rank, int world, int micro, const std::vector<testing::Batch>& data) {
  auto m = models::make_model("lenet", kSample, 10, 5);
  Trajectory r;
  const bool f16 = spec.dp.math.autocast == DType::F16;
  const distributed::ProcessGroup* group = spec.group.get();  // the engine's from here on
  testing::EngineRun e(make_engine(*m, std::move(spec)));
  std::optional<optim::GradScaler> scaler;
  if (f16) scaler.emplace();
  const int64_t local = kBatch / world, piece = local / micro;
  for (const auto& b : data) {
    const float scale = scaler ? scaler->scale() : 1.0f;
    for (int k = 0; k < micro; ++k) {
      const int64_t begin = rank * local + k * piece;
      e->forward_backward(b.x.slice(begin, begin + piece), b.y.slice(begin, begin + piece), scale / kBatch,
                          k == micro - 1);
    }
    if (scaler)
      scaler->step(*e.opt);
    else
      e.opt->step();
    e.opt->zero_grad();
  }
  r.params = m->arenas().params.to(Device::cpu());
  r.grad_elements = m->arenas().grads.numel();
  if (group) r.summed_bytes = group->summed_bytes();
  if (scaler) {
    r.scale = scaler->scale();
    r.skipped = scaler->skipped();
  }
  return r;
}

EngineSpec spec_for(const std::string& devices, DType autocast, DType reduce = DType::F32) {
  EngineSpec s;
  s.devices = parse_devices(devices);
  s.dp.math.autocast = autocast;
  s.dp.grad_reduce_dtype = reduce;
  s.dp.seed = 5;
  return s;
}

std::vector<Trajectory> train_ddp(int world, DType autocast, const std::vector<testing::Batch>& data,
                                  DType reduce = DType::F32) {
  testing::TempDir dir;
  std::vector<Trajectory> runs(world);
  testing::run_ranks(world, [&](int r) {
    EngineSpec s = spec_for("cpu", autocast, reduce);
    s.group = distributed::make_gloo_group({r, world, "file:" + dir.path(), "mixed", 60});
    runs[r] = train(std::move(s), r, world, 1, data);
  });
  return runs;
}

// ||a - b|| / ||b||.
double relative_to_weights(const Trajectory& a, const Trajectory& b) {
  double d = 0, u = 0;
  const float *pa = a.params.f32(), *pb = b.params.f32();
  for (int64_t i = 0; i < b.params.numel(); ++i) {
    d += (static_cast<double>(pa[i]) - pb[i]) * (static_cast<double>(pa[i]) - pb[i]);
    u += static_cast<double>(pb[i]) * pb[i];
  }
  return std::sqrt(d / u);
}

class MixedPrecisionEquivalence : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Types, MixedPrecisionEquivalence, ::testing::Values(DType::BF16, DType::F16),
                         [](const auto& info) { return info.param == DType::BF16 ? "BF16Mixed" : "F16Mixed"; });

TEST_P(MixedPrecisionEquivalence, EveryEngineEqualsOneDeviceWithinTheLowTypesRounding) {
  const DType t = GetParam();
  const double u = t == DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double tolerance = (t == DType::BF16 ? 3 : 6) * u;
  const auto data = testing::random_batches(kSample, kBatch, kSteps, 13);
  const Trajectory one = train(spec_for("cpu", t), 0, 1, 1, data);
  const Trajectory f32 = train(spec_for("cpu", DType::F32), 0, 1, 1, data);
  const double vs_f32 = relative_to_weights(f32, one);
  EXPECT_GT(vs_f32, std::ldexp(1.0, -11)) << "the mixed run should differ from float32";
  std::printf("one device, %s against float32: %.3g u\n", dtype_name(t), vs_f32 / u);

  std::vector<std::pair<std::string, Trajectory>> runs;
  runs.emplace_back("DataParallel cpu:2", train(spec_for("cpu:2", t), 0, 1, 1, data));
  runs.emplace_back("accumulate 4", train(spec_for("cpu", t), 0, 1, 4, data));
  const auto ddp = train_ddp(2, t, data);
  runs.emplace_back("DDP 2 processes, rank 0", ddp[0]);
  runs.emplace_back("DDP 2 processes, rank 1", ddp[1]);
  EXPECT_TRUE(testing::same_bits(ddp[0].params, ddp[1].params)) << "the ranks step the same reduced gradient";
  for (const auto& [name, r] : runs) {
    SCOPED_TRACE(name);
    const double rel = relative_to_weights(r, one);
    std::printf("%-24s against one device: %.3g u\n", name.c_str(), rel / u);
    EXPECT_LT(rel, tolerance);
    EXPECT_EQ(r.skipped, one.skipped);
    EXPECT_EQ(r.scale, one.scale);
  }
}

// --grad-reduce-dtype bf16 (float32 training): DataParallel over cpu:2
// and DDP over 2 processes round each bucket to bfloat16 around the
// reduction, which moves the gradient by at most one bfloat16 rounding
// (u = 2^-8) per element and step; after 20 steps both stay within 3 u of
// float32 one device's parameters, and differ from float32 reduction. DDP's
// buckets travel as bfloat16: 2 bytes per gradient element and step fewer
// than float32 reduction puts on the wire, everything else the same.
TEST(GradReduceDtype, Bf16ReductionOnEveryEngineStaysWithinItsRounding) {
  const double u = std::ldexp(1.0, -8);
  const auto data = testing::random_batches(kSample, kBatch, kSteps, 17);
  const Trajectory one = train(spec_for("cpu", DType::F32), 0, 1, 1, data);
  const Trajectory dp32 = train(spec_for("cpu:2", DType::F32), 0, 1, 1, data);
  std::vector<std::pair<std::string, Trajectory>> runs;
  runs.emplace_back("DataParallel cpu:2", train(spec_for("cpu:2", DType::F32, DType::BF16), 0, 1, 1, data));
  const auto ddp = train_ddp(2, DType::F32, data, DType::BF16);
  runs.emplace_back("DDP 2 processes", ddp[0]);
  EXPECT_TRUE(testing::same_bits(ddp[0].params, ddp[1].params));
  const auto ddp32 = train_ddp(2, DType::F32, data);
  std::printf("DDP bytes summed per rank over %d steps: float32 %lld, bfloat16 %lld\n", kSteps,
              static_cast<long long>(ddp32[0].summed_bytes), static_cast<long long>(ddp[0].summed_bytes));
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(ddp32[r].summed_bytes - ddp[r].summed_bytes, int64_t{2} * kSteps * ddp[r].grad_elements) << "rank " << r;
  for (const auto& [name, r] : runs) {
    SCOPED_TRACE(name);
    const double rel = relative_to_weights(r, one);
    std::printf("%-20s bf16 reduction against float32 one device: %.3g u (float32 DataParallel: %.3g u)\n",
                name.c_str(), rel / u, relative_to_weights(dp32, one) / u);
    EXPECT_LT(rel, 3 * u);
    EXPECT_FALSE(testing::same_bits(r.params, dp32.params)) << "bfloat16 reduction should round";
  }
}

}  // namespace
}  // namespace fanout
