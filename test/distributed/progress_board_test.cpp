// The launcher's progress board: a worker's marks land in its own slot, the
// launcher reads them back and describes where each rank is.
#include "runtime/distributed/progress_board.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace fanout::distributed {
namespace {

void marks_land_in_this_workers_slot() {
  ProgressBoard board(3);
  // Set before this process's first mark: the worker side opens the board once.
  ::setenv("FANOUT_PROGRESS_FD", std::to_string(board.fd()).c_str(), 1);
  ::setenv("LOCAL_RANK", "2", 1);
  EXPECT_EQ(board.read(2).entered, 0u);
  EXPECT_NE(board.describe(2, 5).find("rank 5 has begun no collective"), std::string::npos) << board.describe(2, 5);
  {
    CollectiveMark a("all-reduce of gradient bucket 3 of 7", 301056);
    const ProgressBoard::Seen s = board.read(2);
    EXPECT_EQ(s.entered, 1u);
    EXPECT_EQ(s.inside, 1);
    EXPECT_EQ(s.what, "all-reduce of gradient bucket 3 of 7");
    EXPECT_EQ(s.elements, 301056);
    EXPECT_EQ(board.describe(2, 5).rfind("rank 5 is in all-reduce of gradient bucket 3 of 7 (collective #1, 301056 elements)", 0), 0u)
        << board.describe(2, 5);
    std::thread t([] { CollectiveMark b("barrier 'evaluation'", 0); });  // another thread, as DDP's reducer
    t.join();
    EXPECT_EQ(board.read(2).inside, 1);
    EXPECT_EQ(board.read(2).entered, 2u);
  }
  const ProgressBoard::Seen s = board.read(2);
  EXPECT_EQ(s.inside, 0);
  EXPECT_EQ(s.what, "barrier 'evaluation'");
  EXPECT_GE(s.idle_s, 0.0);
  EXPECT_LT(s.idle_s, 60.0);
  EXPECT_EQ(board.describe(2, 5).rfind("rank 5 is outside any collective for ", 0), 0u) << board.describe(2, 5);
  EXPECT_NE(board.describe(2, 5).find("after barrier 'evaluation' (collective #2, 0 elements)"), std::string::npos);
  for (int other : {0, 1}) EXPECT_EQ(board.read(other).entered, 0u) << other;  // the other slots untouched
  const std::string long_name(300, 'x');
  { CollectiveMark c(long_name, 7); }
  EXPECT_EQ(board.read(2).what, long_name.substr(0, 79));  // cut to the slot, never past it
  board.clear();
  EXPECT_EQ(board.read(2).entered, 0u);
  EXPECT_EQ(board.read(2).what, "");
}

// A worker opens the board at its first mark, once per process: the test runs
// in a fresh process (a "threadsafe" death test executes the binary again, so
// nothing carries over from marks earlier tests made), as a worker would.
TEST(ProgressBoard, MarksLandInThisWorkersSlot) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        marks_land_in_this_workers_slot();
        std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ProgressBoard, WithoutALauncherMarksDoNothing) {
  ::unsetenv("FANOUT_PROGRESS_FD");
  ProgressBoard board(1);
  { CollectiveMark a("all-reduce of gradient bucket 0", 10); }
  EXPECT_EQ(board.read(0).entered, 0u);
}

}  // namespace
}  // namespace fanout::distributed
