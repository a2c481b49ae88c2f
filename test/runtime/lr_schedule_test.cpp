// Learning-rate schedules against torch.optim.lr_scheduler's closed forms.
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

}  // namespace
}  // namespace fanout::optim
