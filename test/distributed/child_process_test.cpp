// The one fork/exec: exit codes, output redirection, the environment given,
// and the line a program that cannot start leaves.
#include "runtime/distributed/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/core/error.h"

namespace fanout::distributed {
namespace {

struct TempLog {
  std::string path = ::testing::TempDir() + "child_process_" + std::to_string(::getpid()) + ".log";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ~TempLog() {
    if (fd >= 0) ::close(fd);
    std::remove(path.c_str());
  }
  std::string text() const {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
};

TEST(ChildProcess, ExitCodeAndOutputGoWhereAsked) {
  TempLog log;
  ASSERT_GE(log.fd, 0);
  ChildSpec spec;
  spec.argv = {"sh", "-c", "echo out; echo err >&2; exit 7"};  // found in PATH
  spec.out_fd = spec.err_fd = log.fd;
  EXPECT_EQ(wait_exit_code(spawn(spec)), 7);
  EXPECT_EQ(log.text(), "out\nerr\n");
}

TEST(ChildProcess, GivenEnvironmentReplacesOurs) {
  TempLog log;
  ::setenv("FANOUT_CHILD_TEST_OURS", "1", 1);
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo \"[$FANOUT_CHILD_TEST_GIVEN][$FANOUT_CHILD_TEST_OURS]\""};
  spec.env = {"FANOUT_CHILD_TEST_GIVEN=x", "PATH=/usr/bin:/bin"};
  spec.out_fd = log.fd;
  EXPECT_EQ(wait_exit_code(spawn(spec)), 0);
  EXPECT_EQ(log.text(), "[x][]\n");
  spec.env.clear();  // empty: this process's environment
  ::close(log.fd);
  log.fd = ::open(log.path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  spec.out_fd = log.fd;
  EXPECT_EQ(wait_exit_code(spawn(spec)), 0);
  EXPECT_EQ(log.text(), "[][1]\n");
  ::unsetenv("FANOUT_CHILD_TEST_OURS");
}

TEST(ChildProcess, KilledChildReports128PlusSignal) {
  ChildSpec spec;
  spec.argv = {"sleep", "30"};
  const pid_t pid = spawn(spec);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_EQ(wait_exit_code(pid), 128 + SIGKILL);
}

TEST(ChildProcess, MissingProgramExits127WithALine) {
  TempLog log;
  ChildSpec spec;
  spec.argv = {"/nonexistent/fanout-no-such-program", "--flag"};
  spec.err_fd = log.fd;
  EXPECT_EQ(wait_exit_code(spawn(spec)), 127);
  EXPECT_EQ(log.text(), "cannot execute /nonexistent/fanout-no-such-program\n");
}

}  // namespace
}  // namespace fanout::distributed
