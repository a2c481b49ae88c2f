// BatchNorm where a channel's mean is large against its spread (1e2, 1e3 and
// 1e4 times it): outputs and running statistics within 1e-5 of a float64
// reference, on one device of every backend and under SyncBatchNorm over
// cpu:3. The old statistics (float sums of x and x^2) were 2e-4 off at 1e2
// and lost the variance entirely at 1e4.
#include <gtest/gtest.h>

#include "kernels/backend_test_util.h"
#include "models/layers/batchnorm.h"
#include "runtime/parallel/data_parallel.h"
#include "support/test_util.h"

namespace fanout {
namespace {

const std::vector<double> kOffsets = {1e2, 1e3, 1e4};

class BatchNormStabilityOnBackend : public testing::BackendTest {};
FANOUT_ON_EVERY_BACKEND(BatchNormStabilityOnBackend);

TEST_P(BatchNormStabilityOnBackend, LargeChannelMeansMatchFloat64) {
  std::mt19937_64 rng(91);
  for (const Shape& s : {Shape{8, 6, 5, 7}, Shape{64, 3}, Shape{32, 3, 33, 31}}) {
    for (double spread : {1.0, 1e-2, 37.0}) {
      SCOPED_TRACE(::testing::Message() << s.str() << " spread " << spread);
      const Tensor x = testing::offset_channels(s, kOffsets, spread, rng);
      models::BatchNorm2d host(s[1], 1e-5f, /*momentum=*/1.0f);  // running stats = this batch's
      host.init(0);                                              // weight 1, bias 0
      auto bn = host.clone(dev());
      const Tensor xd = up(x);
      const Tensor y = down(bn->forward(xd, ctx()));
      const auto ref = testing::bn_reference(x, 1e-5, 1.0);
      EXPECT_LT(testing::max_rel_diff(y, ref.y), 1e-5);
      int checked = 0;
      for (auto& [name, b] : bn->named_buffers()) {
        if (name == "running_var") {
          EXPECT_LT(testing::max_rel_diff(down(b->value), ref.running_var), 1e-5);
          ++checked;
        }
        if (name == "running_mean") {
          EXPECT_LT(testing::max_rel_diff(down(b->value), ref.running_mean), 1e-6);
          ++checked;
        }
      }
      EXPECT_EQ(checked, 2);
    }
  }
}

TEST(BatchNormStability, SyncBatchNormOverThreeReplicasEqualsOneDevice) {
  std::mt19937_64 rng(92);
  const Shape s{8, 6, 5, 7};  // chunks of 3, 3 and 2 rows
  for (double spread : {1.0, 37.0}) {
    SCOPED_TRACE(::testing::Message() << "spread " << spread);
    const Tensor x = testing::offset_channels(s, kOffsets, spread, rng);
    models::BatchNorm2d one(6, 1e-5f, 1.0f);
    one.init(0);
    Context ctx(Device::cpu());
    const Tensor y1 = one.forward(x, ctx);

    models::BatchNorm2d synced(6, 1e-5f, 1.0f);
    synced.init(0);
    DataParallelOptions o;
    o.sync_bn = true;
    DataParallel dp(synced, parse_devices("cpu:3"), o);
    const Tensor y3 = dp.forward(x).to(Device::cpu());
    const auto ref = testing::bn_reference(x, 1e-5, 1.0);
    EXPECT_LT(testing::max_rel_diff(y3, ref.y), 1e-5);
    EXPECT_LT(testing::max_rel_diff(y3, y1), 1e-6);  // pooled statistics: one device's, to rounding
    EXPECT_LT(testing::max_rel_diff(synced.running_var().value, ref.running_var), 1e-5);
    EXPECT_LT(testing::max_rel_diff(synced.running_mean().value, ref.running_mean), 1e-6);
  }
}

}  // namespace
}  // namespace fanout
