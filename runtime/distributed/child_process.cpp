// fork/exec with the child tied to this process's life.
#include "runtime/distributed/child_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/core/error.h"

extern char** environ;

namespace fanout::distributed {

pid_t spawn(const ChildSpec& spec) {
  FANOUT_CHECK(!spec.argv.empty()) << "spawn without a program";
  // Everything the child needs is made before fork: it only calls exec.
  std::vector<std::string> argv_s = spec.argv, env_s = spec.env;
  std::vector<char*> argv, envp;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* const* env = spec.env.empty() ? environ : envp.data();
  const std::string cannot = "cannot execute " + spec.argv[0] + "\n";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, spec.death_signal);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    if (spec.own_process_group) ::setpgid(0, 0);
    if (spec.out_fd >= 0) ::dup2(spec.out_fd, STDOUT_FILENO);
    if (spec.err_fd >= 0) ::dup2(spec.err_fd, STDERR_FILENO);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    ::execvpe(argv[0], argv.data(), env);
    write_all(STDERR_FILENO, cannot.data(), cannot.size());
    ::_exit(127);
  }
  FANOUT_USER_CHECK(pid > 0) << "cannot start " << spec.argv[0] << ": " << std::strerror(errno);
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace fanout::distributed
