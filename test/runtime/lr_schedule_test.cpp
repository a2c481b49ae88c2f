// Learning-rate schedules against torch.optim.lr_scheduler's closed forms,
// and warmup-cosine against nanoGPT's get_lr (written here in double).
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/core/error.h"
#include "runtime/optim/lr_schedule.h"

namespace fanout::optim {
namespace {

TEST(LrSchedule, Step) {
  auto s = parse_lr_schedule("step:2:0.5", 0.1f, 10, 0);
  EXPECT_FLOAT_EQ(s.at(0, 0, 10), 0.1f);
  EXPECT_FLOAT_EQ(s.at(1, 9, 10), 0.1f);
  EXPECT_FLOAT_EQ(s.at(2, 0, 10), 0.05f);
  EXPECT_FLOAT_EQ(s.at(5, 0, 10), 0.025f);
}

TEST(LrSchedule, MultiStep) {
  auto s = parse_lr_schedule("multistep:3,5:0.1", 1.0f, 10, 0);
  EXPECT_FLOAT_EQ(s.at(2, 0, 1), 1.0f);
  EXPECT_FLOAT_EQ(s.at(3, 0, 1), 0.1f);
  EXPECT_NEAR(s.at(5, 0, 1), 0.01f, 1e-7);
}

TEST(LrSchedule, Cosine) {
  auto s = parse_lr_schedule("cosine", 0.2f, 4, 0);
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(s.at(e, 0, 5), 0.1 * (1 + std::cos(M_PI * e / 4)), 1e-7);
}

TEST(LrSchedule, LinearWarmupPerIteration) {
  auto s = parse_lr_schedule("constant", 0.4f, 5, 1.0f);
  EXPECT_NEAR(s.at(0, 0, 4), 0.1, 1e-7);
  EXPECT_NEAR(s.at(0, 1, 4), 0.2, 1e-7);
  EXPECT_NEAR(s.at(0, 3, 4), 0.4, 1e-7);
  EXPECT_NEAR(s.at(1, 0, 4), 0.4, 1e-7);
}

TEST(LrSchedule, BadSpecs) {
  for (const char* bad : {"linear", "step:0", "step:x", "multistep", "multistep:5,3", "cosine:3", ""})
    EXPECT_THROW(parse_lr_schedule(bad, 0.1f, 10, 0), Error) << bad;
  EXPECT_THROW(parse_lr_schedule("cosine", 0.1f, 10, -1), Error);
}

// nanoGPT's get_lr(it): lr (it + 1) / (warmup + 1) while it < warmup; min_lr
// past lr_decay_iters; a cosine between. The step index runs across epochs.
TEST(LrSchedule, WarmupCosineIsNanoGptsPerStep) {
  LrSchedule s = parse_lr_schedule("warmup-cosine", 1e-3f, 10, 0);
  set_warmup_cosine(s, 100, 2000, 1e-4f);
  auto nanogpt = [](int it) {
    const double lr = 1e-3, min_lr = 1e-4;
    if (it < 100) return lr * (it + 1) / 101;
    if (it > 2000) return min_lr;
    const double ratio = (it - 100) / 1900.0;
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (lr - min_lr);
  };
  const int per_epoch = 37;
  for (int it : {0, 1, 50, 99, 100, 101, 777, 1999, 2000, 2001, 5000}) {
    const float got = s.at(it / per_epoch, it % per_epoch, per_epoch);
    EXPECT_NEAR(got, nanogpt(it), 1e-6 * nanogpt(it)) << "step " << it;
  }
  EXPECT_THROW(parse_lr_schedule("warmup-cosine", 1e-3f, 10, 0.5f), Error);  // steps, not epochs
  LrSchedule bad = parse_lr_schedule("warmup-cosine", 1e-3f, 10, 0);
  EXPECT_THROW(set_warmup_cosine(bad, 100, 100, 0), Error);
  EXPECT_THROW(set_warmup_cosine(bad, 0, 100, 2e-3f), Error);
}

}  // namespace
}  // namespace fanout::optim
