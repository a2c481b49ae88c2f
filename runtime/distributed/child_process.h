// Starting a child process: the one fork/exec of the project, used by the
// launcher (its workers) and by dp-bench --epochs (its runs).
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace fanout::distributed {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0] is the program: a path, or a name looked up in PATH
  std::vector<std::string> env;   // the child's whole environment; empty: this process's
  int out_fd = -1, err_fd = -1;   // the child's stdout and stderr; -1: this process's
  // Sent to the child when this process dies, so none is left behind.
  int death_signal = 9;           // SIGKILL
  bool own_process_group = false; // signals reach it through us alone (a terminal's Ctrl-C, say)
};

// Forks and executes `spec`; returns the child's pid. The child restores
// the default SIGINT and SIGTERM handlers, and exits 127 (with a line on its
// stderr) when the program cannot be executed. One line of error when the
// fork fails.
pid_t spawn(const ChildSpec& spec);

// Waits for `pid` (retrying on signals); returns its exit status, or 128 +
// the signal that killed it.
int wait_exit_code(pid_t pid);

// Writes all n bytes to fd, retrying short writes and signals; gives up
// silently on an error (a closed pipe or terminal).
void write_all(int fd, const char* p, size_t n);

}  // namespace fanout::distributed
