// The progress lines: one per tenth of the epoch, the rate in samples or in
// tokens, ETA, running loss and metric.
#include "runtime/train/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace fanout::train {
namespace {

std::vector<std::string> lines_of(FILE* f) {
  std::rewind(f);
  std::vector<std::string> out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) out.emplace_back(buf);
  return out;
}

// One update after a pause; the printed rate must lie between what the
// interval around the update allows.
void check_rate(int64_t tokens_per_sample, const char* unit) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Progress p(Progress::Mode::Lines, f);
  using Clock = std::chrono::steady_clock;
  const auto before_begin = Clock::now();
  p.begin("epoch 1/2", 10, 40, tokens_per_sample);
  const auto after_begin = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto before_update = Clock::now();
  p.update(1, 4, 2.5, "acc %.4f", 0.25);
  const auto after_update = Clock::now();
  const std::vector<std::string> lines = lines_of(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 1u);
  double rate = 0;
  char shown_unit[16] = "";
  ASSERT_EQ(std::sscanf(lines[0].c_str(), "epoch 1/2  10%% 1/10 batches  %lf %15s", &rate, shown_unit), 2)
      << lines[0];
  EXPECT_STREQ(shown_unit, unit);
  const double per_sample = tokens_per_sample > 0 ? static_cast<double>(tokens_per_sample) : 1.0;
  const double secs_max = std::chrono::duration<double>(after_update - before_begin).count();
  const double secs_min = std::chrono::duration<double>(before_update - after_begin).count();
  EXPECT_GE(rate, 4 * per_sample / secs_max - 0.5) << lines[0];
  EXPECT_LE(rate, 4 * per_sample / secs_min + 0.5) << lines[0];
  EXPECT_NE(lines[0].find("loss 2.5000  acc 0.2500"), std::string::npos) << lines[0];
}

TEST(Progress, LinesGiveTheRateInSamples) { check_rate(0, "img/s"); }

TEST(Progress, LinesGiveTheRateInTokensForTokenSamples) { check_rate(256, "tokens/s"); }

// Shown only once the work has run a while (a long evaluation): the rate counts from when it began.
TEST(Progress, ARateCountsFromWhenTheWorkBegan) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  Progress p(Progress::Mode::Lines, f);
  using Clock = std::chrono::steady_clock;
  const auto began = Clock::now() - std::chrono::seconds(40);
  p.begin("epoch 1/1 evaluation", 10, 100, 0, began);
  p.update(4, 40, 2.5, nullptr, 0);
  const double secs = std::chrono::duration<double>(Clock::now() - began).count();
  const std::vector<std::string> lines = lines_of(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 1u);
  double rate = 0;
  ASSERT_EQ(std::sscanf(lines[0].c_str(), "epoch 1/1 evaluation  40%% 4/10 batches  %lf img/s", &rate), 1) << lines[0];
  EXPECT_LE(rate, 1.0) << lines[0];  // 40 samples in 40 s or a little more
  EXPECT_GE(rate, 40 / (secs + 1) - 0.5) << lines[0];
  EXPECT_NE(lines[0].find("ETA 1:0"), std::string::npos) << "60 samples at 1/s: a minute left: " << lines[0];
}

// The lines of an epoch of `batches` batches of 4 samples, updated after each.
std::vector<std::string> epoch_lines(Progress::Mode mode, const std::string& label, int64_t batches) {
  FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  if (!f) return {};
  Progress p(mode, f);
  p.begin(label, batches, 4 * batches);
  for (int64_t b = 1; b <= std::max<int64_t>(batches, 1); ++b) p.update(b, 4 * b, 1.0, nullptr, 0);
  std::vector<std::string> lines = lines_of(f);
  std::fclose(f);
  return lines;
}

TEST(Progress, OneLineEachTenthOfTheEpoch) {
  const std::vector<std::string> lines = epoch_lines(Progress::Mode::Lines, "epoch 3/3", 25);
  // Tenths reached at batches 3 (12%), 5, 8, 10, 13, 15, 18, 20, 23, 25.
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines.front().rfind("epoch 3/3  12% 3/25 batches", 0), 0u) << lines.front();
  EXPECT_EQ(lines.back().rfind("epoch 3/3 100% 25/25 batches", 0), 0u) << lines.back();
  EXPECT_EQ(lines.back().find("acc"), std::string::npos) << lines.back();
}

TEST(Progress, OffAndEmptyEpochsPrintNothing) {
  EXPECT_TRUE(epoch_lines(Progress::Mode::Off, "epoch 1/1", 4).empty());
  EXPECT_TRUE(epoch_lines(Progress::Mode::Lines, "epoch 1/1", 0).empty());
}

TEST(Progress, DurationsAsMinutesOrHours) {
  EXPECT_EQ(format_duration(0), "0:00");
  EXPECT_EQ(format_duration(65.4), "1:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-3), "0:00");
  EXPECT_EQ(format_duration(std::nan("")), "0:00");
}

}  // namespace
}  // namespace fanout::train
