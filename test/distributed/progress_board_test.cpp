// The launcher's progress board: a worker's marks land in its own slot, the
// launcher reads them back and describes where each rank is.
#include "runtime/distributed/progress_board.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

namespace fanout::distributed {
namespace {

// The tests below run in a child process (a death test), whose failures the
// parent shows only from its stderr: runs fn there, writes its failed
// expectations to stderr and exits 0 when there were none, else 1.
[[noreturn]] void run_and_exit(void (*fn)()) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
    fn();
  }
  bool failed = false;
  for (int i = 0; i < results.size(); ++i) {
    const ::testing::TestPartResult& r = results.GetTestPartResult(i);
    if (!r.failed()) continue;
    failed = true;
    std::fprintf(stderr, "%s:%d: %s\n", r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }
  std::fflush(stderr);
  std::_Exit(failed ? 1 : 0);
}

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
      run_and_exit(marks_land_in_this_workers_slot),
      ::testing::ExitedWithCode(0), "");
}

// What this process has of the board: how many times its memfd is mapped
// (/proc/self/maps names it "/memfd:fanout-progress") and how many files it
// has open.
int board_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/memfd:fanout-progress") != std::string::npos;
  return n;
}
int open_files() {
  namespace fs = std::filesystem;
  return static_cast<int>(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{}));
}

// A process that has a board at hand, and a local rank (as a worker of
// mpirun or torchrun has), but no FANOUT_PROGRESS_FD: its marks must not
// find the board by any other road (a guessed descriptor, a scan of its open
// files), open or map anything, or write anywhere a launcher would read.
void marks_without_a_launcher_do_nothing() {
  ::unsetenv("FANOUT_PROGRESS_FD");
  ::setenv("LOCAL_RANK", "0", 1);
  ProgressBoard board(2);
  const int mappings = board_mappings(), files = open_files();
  EXPECT_EQ(mappings, 1);  // the board's own (launcher side)
  EXPECT_NO_THROW({
    CollectiveMark a("all-reduce of gradient bucket 0", 10, 4);
    std::thread t([] { CollectiveMark b("barrier 'evaluation'", 0); });
    t.join();
  });
  EXPECT_THROW(
      {
        CollectiveMark c("broadcast of the parameters", 20);
        throw std::runtime_error("a failed collective");
      },
      std::runtime_error);
  for (int slot : {0, 1}) {
    const ProgressBoard::Seen s = board.read(slot);
    EXPECT_EQ(s.entered, 0u) << slot;
    EXPECT_EQ(s.inside, 0) << slot;
    EXPECT_FALSE(s.failed) << slot;
    EXPECT_EQ(s.what, "") << slot;
    EXPECT_EQ(s.number, 0u) << slot;
    EXPECT_NE(board.describe(slot, slot).find("has begun no collective"), std::string::npos) << board.describe(slot, slot);
  }
  EXPECT_EQ(board_mappings(), mappings) << "a mark mapped the board";
  EXPECT_EQ(open_files(), files) << "a mark opened a file";
}

// In a fresh process (see above), so that no earlier mark in this binary
// decided for it whether there is a board.
TEST(ProgressBoard, WithoutALauncherMarksDoNothing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      run_and_exit(marks_without_a_launcher_do_nothing),
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace fanout::distributed
