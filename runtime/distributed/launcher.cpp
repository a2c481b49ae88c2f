// Worker launcher: fork/exec per local rank, pipes for their output, a poll
// loop that routes output and reaps workers, and a stop sequence on failure.
// A Supervisor holds one start's workers; its OutputRouter routes their
// output and its Watch reads the progress board for stalls and desyncs.
#include "runtime/distributed/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "runtime/core/error.h"
#include "runtime/core/file_lock.h"
#include "runtime/distributed/child_process.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/progress_board.h"

extern char** environ;

namespace fanout::distributed {

namespace fs = std::filesystem;

namespace {

int parse_env_int(const char* name, int lo) {
  const char* v = std::getenv(name);
  FANOUT_USER_CHECK(v && *v) << name << " is not set";
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  FANOUT_USER_CHECK(end && *end == '\0' && x >= lo && x <= 1 << 20)
      << "bad " << name << "='" << v << "' (expected an integer >= " << lo << ")";
  return static_cast<int>(x);
}

volatile sig_atomic_t g_signal = 0, g_signals = 0;
void on_signal(int s) {
  g_signal = s;
  g_signals = g_signals + 1;
}

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends
  std::string err_line;    // partial stderr line
  std::string last_error;  // last complete non-empty stderr line
  std::string error_line;  // its "NAME: error: ..." line, held back for the launcher's report
  std::ofstream log;
  bool done = false;
  int status = 0;
};

std::string describe(const Worker& w, bool other_machines) {
  std::string s = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ")";
  if (WIFSIGNALED(w.status)) {
    const int sig = WTERMSIG(w.status);
    s += " was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  } else {
    const int code = WEXITSTATUS(w.status);
    s += " exited with status " + std::to_string(code);
    // dp-train's status after a stop the ranks agreed on: a signal on another machine (or to this worker).
    if (other_machines && (code == 128 + SIGINT || code == 128 + SIGTERM) && w.last_error.empty())
      s += " (stopped with the run: " + std::string(strsignal(code - 128)) + " on another machine, or to it)";
  }
  if (!w.last_error.empty()) s += ": " + w.last_error;
  return s;
}

// The text after the last carriage return (a progress bar redraws with \r).
std::string last_line(const std::string& s) {
  const auto cr = s.rfind('\r');
  return cr == std::string::npos ? s : s.substr(cr + 1);
}

bool failed(const Worker& w) { return WIFSIGNALED(w.status) || WEXITSTATUS(w.status) != 0; }

// A process's state letter from /proc (R, S, D, T stopped, t traced...), or '?'.
char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

// One start of the workers.
struct Start {
  std::vector<std::string> base_env;  // their environment, less the variables a worker's identity sets
  std::string rdzv, run_id;
  int world = 1;
  int restart = 0;  // 0: the first start
  bool tty = false;
  ProgressBoard* board = nullptr;  // where each worker is; slot i is local worker i
};

struct Ended {
  int code = 0;              // 0, the failing worker's exit status, or 128 + the signal
  bool interrupted = false;  // the launcher was signalled
  std::string error;         // the first failing worker's error line, if it gave one
};

using Clock = std::chrono::steady_clock;

// The local time as "2026-12-01 23:37:54".
std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// One launcher's hold on a --log-dir (each machine's: DIR/.fanout-node-K.lock, holding its pid),
// so that two runs never write one rank's log at once; the kernel drops it with the process.
class LogDirLock {
 public:
  LogDirLock(const std::string& dir, int node_rank) {
    if (dir.empty()) return;
    const std::string path = dir + "/.fanout-node-" + std::to_string(node_rank) + ".lock";
    std::string holder;
    const int err = lock_.take(path, std::to_string(::getpid()), &holder);
    FANOUT_USER_CHECK(err != EWOULDBLOCK) << "--log-dir " << dir << " is in use by another run"
                                          << (holder.empty() ? std::string() : " (pid " + holder + ")")
                                          << ": give each run its own";
    FANOUT_USER_CHECK(err == 0) << "cannot " << (std::strcmp(lock_.failed_step(), "lock") == 0 ? "lock" : "write")
                                << " " << path << " (--log-dir's lock): " << strerror(err);
  }

 private:
  FileLock lock_;
};

// The launch's exit code for a worker: its exit status, or 128 + the signal that killed it.
int exit_code(const Worker& w) { return WIFSIGNALED(w.status) ? 128 + WTERMSIG(w.status) : WEXITSTATUS(w.status); }

// One line of a rank's text on our stderr: "[rank N] text".
void write_rank_line(int rank, const std::string& text) {
  const std::string line = "[rank " + std::to_string(rank) + "] " + text + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

// Local worker i's environment: the launcher's, its identity (torchrun's names) and the run's.
std::vector<std::string> worker_environment(const LaunchOptions& o, const Start& st, int i, int rank) {
  std::vector<std::string> env_s = st.base_env;
  env_s.push_back("RANK=" + std::to_string(rank));
  env_s.push_back("LOCAL_RANK=" + std::to_string(i));
  env_s.push_back("WORLD_SIZE=" + std::to_string(st.world));
  env_s.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node));
  env_s.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  env_s.push_back("FANOUT_RDZV=" + st.rdzv);
  env_s.push_back("FANOUT_RUN_ID=" + st.run_id);
  env_s.push_back("FANOUT_RESTART_COUNT=" + std::to_string(st.restart));
  if (st.board) env_s.push_back("FANOUT_PROGRESS_FD=" + std::to_string(st.board->fd()));
  env_s.push_back("FANOUT_LAUNCHED=1");
  if (st.tty) env_s.push_back("FANOUT_STDERR_TTY=1");
  return env_s;
}

// The workers' output: rank 0's stdout and stderr pass through as they come
// (its progress bar's \r included), the other ranks' stderr line by line with
// a "[rank N] " prefix; everything also goes to the rank's log. Error lines
// ("NAME: error: ...") are held back in Worker::error_line: the report shows
// each different one once, not once per rank and again in the summary.
class OutputRouter {
 public:
  explicit OutputRouter(const std::string& name)
      : name_(name), err_prefix_(name + ": error: "), internal_prefix_(name + ": internal error: "), buf_(1 << 16) {}

  // Waits up to 100 ms for output on the workers' open pipes and routes what
  // came; a pipe at its end is closed (its partial stderr line routed).
  void route(std::vector<Worker>& workers) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, bool>> who;  // worker, is stderr
    for (auto& w : workers) {
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0}), who.emplace_back(&w, false);
      if (w.err >= 0) fds.push_back({w.err, POLLIN, 0}), who.emplace_back(&w, true);
    }
    ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = *who[k].first;
      const bool is_err = who[k].second;
      const ssize_t n = ::read(fds[k].fd, buf_.data(), buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[k].fd);
        (is_err ? w.err : w.out) = -1;
        if (is_err) route_err(w, false);
        continue;
      }
      if (w.log.is_open() && !w.log.write(buf_.data(), n).flush()) {
        // Losing a log ends no run: said once, the rank's output still reaches the terminal.
        std::fprintf(stderr, "%s: warning: cannot write rank %d's --log-dir file any more (disk full?); its output "
                     "is no longer logged\n", name_.c_str(), w.rank);
        w.log.close();
      }
      if (!is_err) {
        if (w.rank == 0) write_all(STDOUT_FILENO, buf_.data(), static_cast<size_t>(n));
        continue;
      }
      w.err_line.append(buf_.data(), static_cast<size_t>(n));
      route_err(w, true);
    }
  }

 private:
  bool is_error(const std::string& t) const { return t.starts_with(err_prefix_) || t.starts_with(internal_prefix_); }

  // One stderr line (seg, with its terminator if any): noted as the rank's
  // last error, then held back (an error line) or written out.
  void route_line(Worker& w, const std::string& seg) {
    std::string text = seg;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!last_line(text).empty()) w.last_error = last_line(text);
    if (is_error(text)) {
      w.error_line = text;
    } else if (w.rank == 0) {
      write_all(STDERR_FILENO, seg.data(), seg.size());
    } else {
      write_rank_line(w.rank, text);
    }
  }

  // Routes the complete lines in w.err_line (rank 0's end at \r too); the
  // rest waits for more unless the pipe has closed (more: it is still open).
  void route_err(Worker& w, bool more) {
    const char* ends = w.rank == 0 ? "\r\n" : "\n";
    size_t start = 0, end;
    while ((end = w.err_line.find_first_of(ends, start)) != std::string::npos) {
      route_line(w, w.err_line.substr(start, end + 1 - start));
      start = end + 1;
    }
    w.err_line.erase(0, start);
    const std::string& rest = w.err_line;
    const bool may_be_error = is_error(rest) || err_prefix_.starts_with(rest) || internal_prefix_.starts_with(rest);
    if (!rest.empty() && (!more || (w.rank == 0 && !may_be_error))) {
      route_line(w, rest);  // rank 0's partial line shows at once unless it may be an error line
      w.err_line.clear();
    }
  }

  const std::string name_, err_prefix_, internal_prefix_;
  std::vector<char> buf_;
};

// The stall and desync watch: reads the progress board (and /proc) to say
// where the ranks are and to name a rank that keeps the others waiting.
// Every method but where_all needs a board.
class Watch {
 public:
  // other_machines: ranks run elsewhere too, whose waits this board does not show.
  Watch(const std::vector<Worker>& workers, const ProgressBoard* board, bool other_machines)
      : workers_(workers), board_(board), other_machines_(other_machines), stopped_since_(workers.size()) {}

  // Where the ranks are, from the progress board: one clause per rank.
  // Worth a line when a rank still waits in a collective (not after a bad option, say).
  std::string where_all() const {
    std::string s;
    if (!board_ || !someone_inside()) return s;
    for (size_t i = 0; i < workers_.size(); ++i) s += (s.empty() ? "" : "; ") + where(i);
    return s;
  }

  // A rank that keeps the others waiting: stopped (SIGSTOP, a debugger) or
  // outside any collective for `after` seconds while another waits inside
  // one, or behind `failed` (a rank that ended, as a collective timed out);
  // with ranks on other machines, stopped for `after` seconds alone (theirs
  // wait on it unseen). Empty when there is none.
  std::string find_stall(double after, const Worker* failed) {
    const uint64_t failed_at = failed ? board_->read(static_cast<int>(failed - workers_.data())).entered : 0;
    const bool someone_waits = failed_at > 0 || someone_inside();
    for (size_t i = 0; i < workers_.size(); ++i) {
      const Worker& w = workers_[i];
      if (w.done) continue;
      const char state = proc_state(w.pid);
      if (state != 'T' && state != 't') stopped_since_[i] = {};
      else if (stopped_since_[i] == Clock::time_point{}) stopped_since_[i] = Clock::now();
      const double stopped_s = stopped_since_[i] == Clock::time_point{}
                                   ? 0
                                   : std::chrono::duration<double>(Clock::now() - stopped_since_[i]).count();
      if (!someone_waits && !(other_machines_ && stopped_s >= after)) continue;
      const ProgressBoard::Seen seen = board_->read(static_cast<int>(i));
      const bool behind = !failed || seen.entered < failed_at;
      char head[160];
      // The board's idle clock starts at the rank's last step, before the
      // launcher first sees it stopped: a stopped rank may be idle long
      // enough first, and is still named as stopped.
      const char* stopped = stopped_since_[i] == Clock::time_point{} ? "" : " is stopped (SIGSTOP or a debugger) and";
      if (stopped_s >= after)
        std::snprintf(head, sizeof head, "rank %d (pid %d) is stopped (SIGSTOP or a debugger) for %.0f s", w.rank,
                      static_cast<int>(w.pid), stopped_s);
      else if (seen.inside == 0 && seen.idle_s >= after && behind)
        std::snprintf(head, sizeof head, "rank %d (pid %d)%s has made no progress for %.0f s", w.rank,
                      static_cast<int>(w.pid), stopped, seen.idle_s);
      else
        continue;
      std::string others;
      for (size_t j = 0; j < workers_.size(); ++j)
        if (j != i) others += "; " + where(j);
      return std::string(head) + ": " + where(i) + others;
    }
    return {};
  }

  // Ranks stuck in (or failed in) collectives of different numbers: one
  // skipped or added a collective. The Gloo group's tags make such ranks
  // wait for each other instead of mixing their buffers. Empty when in step.
  std::string find_desync() const {
    std::vector<size_t> stuck;
    for (size_t i = 0; i < workers_.size(); ++i) {
      const ProgressBoard::Seen seen = board_->read(static_cast<int>(i));
      if (seen.failed || (!workers_[i].done && seen.inside > 0)) stuck.push_back(i);
    }
    // The group's own numbers (Gloo's, per tag) when it gives them: a skipped
    // collective shifts them, not the count of collectives begun.
    auto number = [&](size_t i) { return board_->read(static_cast<int>(i)).id(); };
    bool differ = false;
    for (size_t i : stuck) differ = differ || number(i) != number(stuck[0]);
    if (!differ) return {};
    std::string s =
        "the ranks' collectives are out of step (a rank skipped or added one; every rank must make the same "
        "collectives in the same order): ";
    for (size_t k = 0; k < stuck.size(); ++k) s += (k ? "; " : "") + where(stuck[k]);
    return s;
  }

 private:
  // Where local worker j is: in or after which collective, or how it ended.
  std::string where(size_t j) const {
    if (!workers_[j].done) return board_->describe(static_cast<int>(j), workers_[j].rank);
    const ProgressBoard::Seen seen = board_->read(static_cast<int>(j));
    const std::string rank = "rank " + std::to_string(workers_[j].rank);
    if (seen.entered == 0) return rank + " ended before any collective";
    if (seen.failed) return board_->describe(static_cast<int>(j), workers_[j].rank);
    return rank + " ended after " + seen.what + " (collective #" + std::to_string(seen.id()) + ")";
  }

  // Whether a running rank waits inside a collective now.
  bool someone_inside() const {
    for (size_t i = 0; i < workers_.size(); ++i)
      if (!workers_[i].done && board_->read(static_cast<int>(i)).inside > 0) return true;
    return false;
  }

  const std::vector<Worker>& workers_;
  const ProgressBoard* board_;
  bool other_machines_;
  std::vector<Clock::time_point> stopped_since_;  // when each rank was first seen stopped; {}: running
};

// The children of one start: starts them, then, round by round, routes their
// output, reaps them and stops them all on a signal, a failure or a stall
// (the signal passed on, SIGTERM or SIGKILL; then SIGKILL when the grace
// runs out); the report says why the start ended and gives its exit code.
class Supervisor {
 public:
  Supervisor(const LaunchOptions& o, const Start& st)
      : o_(o), st_(st), workers_(o.nproc_per_node), router_(o.name), watch_(workers_, st.board, o.nnodes > 1) {}
  Supervisor(const Supervisor&) = delete;  // first_failure_ and watch_ point into workers_
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts every local worker, each in its own process group with its output on pipes.
  void start() {
    std::vector<std::string> argv{o_.program};
    argv.insert(argv.end(), o_.args.begin(), o_.args.end());
    for (int i = 0; i < o_.nproc_per_node; ++i) start_worker(i, argv);
  }

  // Whether a worker still runs or still has a pipe open.
  bool running() const {
    for (const auto& w : workers_)
      if (!w.done || w.out >= 0 || w.err >= 0) return true;
    return false;
  }

  // Waits up to 100 ms for the workers' output and routes it.
  void route_output() { router_.route(workers_); }

  // Reaps the workers that have exited. Returns the one to blame among those
  // that failed this round: one killed by a signal is the likelier cause (the
  // others saw it go and failed after); null when none failed.
  const Worker* reap() {
    const Worker* round_failure = nullptr;
    for (auto& w : workers_) {
      if (w.done) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.done = true;
      w.status = status;
      if (failed(w) && (!round_failure || (WIFSIGNALED(w.status) && !WIFSIGNALED(round_failure->status))))
        round_failure = &w;
    }
    return round_failure;
  }

  // SIGINT or SIGTERM to the launcher: passed on, and the workers get
  // stop_grace_s to stop after their step and save; a second signal kills them.
  void pass_on_signal() {
    if (!interrupted_ && g_signal) {
      interrupted_ = g_signal;
      interrupted_at_ = Clock::now();
      stop_all(interrupted_);
      if (!stopping_)
        kill_at_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.stop_grace_s * 1000));
      stopping_ = true;
    }
    // Repeats within a second are the same request (timeout(1) signals the
    // process and then its group: one timeout, two signals).
    if (interrupted_ && Clock::now() - interrupted_at_ < std::chrono::seconds(1)) signals_seen_ = g_signals;
    if (interrupted_ && g_signals > signals_seen_) kill_at_ = Clock::now();
  }

  // The first failure, unless already stopping: notes where the ranks were,
  // and a stall or desync behind it, then stops the others (SIGTERM and
  // grace_s; SIGKILL at once when a rank stalls).
  void stop_on_failure(const Worker* failure) {
    if (!failure || first_failure_ || stopping_) return;
    first_failure_ = failure;
    whereabouts_ = watch_.where_all();
    // A collective that timed out on one rank because another stalls: name the one that stalls.
    if (o_.stall_s > 0 && st_.board) stall_ = watch_.find_stall(o_.stall_s / 2, failure);
    if (stall_.empty() && st_.board && !WIFSIGNALED(failure->status)) desync_ = watch_.find_desync();
    stopping_ = true;
    stop_all(stall_.empty() ? SIGTERM : SIGKILL);
    kill_at_ = Clock::now() + std::chrono::milliseconds(stall_.empty() ? static_cast<int64_t>(o_.grace_s * 1000) : 0);
  }

  // With --timeout, unless already stopping: a rank that keeps the others
  // waiting for stall_s is named and every worker killed.
  void stop_on_stall() {
    if (!stopping_ && o_.stall_s > 0 && st_.board) {
      stall_ = watch_.find_stall(o_.stall_s, nullptr);
      if (!stall_.empty()) {
        stopping_ = true;
        stop_all(SIGKILL);  // a stopped or stuck process would not act on SIGTERM
        kill_at_ = Clock::now();
      }
    }
  }

  // Once stopping and past the grace: SIGKILL to every worker left.
  void kill_when_due() {
    if (stopping_ && Clock::now() > kill_at_) {
      stop_all(SIGKILL);
      // Pipes of killed workers close; anything their children hold open must not keep us here.
      for (auto& w : workers_)
        if (w.done && w.err < 0 && w.out >= 0) ::close(w.out), w.out = -1;
    }
  }

  // Prints why the start ended (interrupted, a stall, a desync, a failure) and returns its exit code.
  Ended report() const {
    // The held-back error lines: the first failure's in the summary, the others' when they differ from it.
    const std::string first_error =
        first_failure_ && !WIFSIGNALED(first_failure_->status) ? first_failure_->error_line : std::string();
    for (const auto& w : workers_)
      if (!w.error_line.empty() && w.error_line != first_error) write_rank_line(w.rank, w.error_line);
    if (interrupted_) {
      std::fprintf(stderr, "%s: interrupted (%s): stopped %d worker%s\n", o_.name.c_str(), strsignal(interrupted_),
                   o_.nproc_per_node, o_.nproc_per_node == 1 ? "" : "s");
      return {128 + interrupted_, true, {}};
    }
    if (!stall_.empty()) {
      if (first_failure_ && !first_error.empty()) write_rank_line(first_failure_->rank, first_error);
      std::fprintf(stderr, "%s: %s; stopped the workers (--timeout %g s)\n", o_.name.c_str(), stall_.c_str(),
                   o_.stall_s);
      return {124, false, {}};
    }
    if (first_failure_ && !desync_.empty()) {
      if (!first_error.empty()) write_rank_line(first_failure_->rank, first_error);
      std::fprintf(stderr, "%s: %s; stopped the workers\n", o_.name.c_str(), desync_.c_str());
      return {exit_code(*first_failure_), false, {}};
    }
    if (first_failure_) {
      if (!whereabouts_.empty())
        std::fprintf(stderr, "%s: when it failed: %s\n", o_.name.c_str(), whereabouts_.c_str());
      if (!first_error.empty())
        std::fprintf(stderr, "%s (rank %d; stopped the other workers)\n", first_error.c_str(), first_failure_->rank);
      else
        std::fprintf(stderr, "%s: %s; stopped the other workers\n", o_.name.c_str(),
                     describe(*first_failure_, o_.nnodes > 1).c_str());
      return {exit_code(*first_failure_), false, first_error};
    }
    return {0, false, {}};
  }

 private:
  // Starts local worker i, its stdout and stderr on pipes, its log opened.
  // If it cannot be started, the workers started before it are killed and reaped.
  void start_worker(int i, const std::vector<std::string>& argv) {
    Worker& w = workers_[i];
    w.rank = o_.node_rank * o_.nproc_per_node + i;
    std::vector<std::string> env_s = worker_environment(o_, st_, i, w.rank);
    int out[2], err[2];
    FANOUT_USER_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0)
        << "cannot create pipes for the workers: " << strerror(errno);
    ChildSpec spec;
    spec.argv = argv;
    spec.env = std::move(env_s);
    spec.out_fd = out[1];
    spec.err_fd = err[1];
    spec.own_process_group = true;  // signals reach a worker through the launcher alone, once
    pid_t pid = -1;
    try {
      pid = spawn(spec);
    } catch (...) {
      for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      stop_all(SIGKILL);
      for (auto& x : workers_)
        if (x.pid > 0) ::waitpid(x.pid, nullptr, 0);
      throw;
    }
    ::close(out[1]);
    ::close(err[1]);
    w.pid = pid;
    w.out = out[0];
    w.err = err[0];
    if (!o_.log_dir.empty()) {
      // Appended to, with a mark: an earlier run's output (the one a --resume continues) and a failed
      // start's stay for the post-mortem.
      const std::string path = o_.log_dir + "/rank-" + std::to_string(w.rank) + ".log";
      std::error_code ec;
      const bool earlier = std::filesystem::exists(path, ec);
      w.log.open(path, std::ios::app);
      if (!w.log.is_open())
        std::fprintf(stderr, "%s: warning: cannot open rank %d's --log-dir file; its output is not logged\n",
                     o_.name.c_str(), w.rank);
      else if (st_.restart > 0)
        w.log << "--- " << o_.name << ": restart " << st_.restart << " of " << o_.max_restarts << " ---\n" << std::flush;
      else if (earlier)
        w.log << "--- " << o_.name << ": a new run (pid " << ::getpid() << ", " << now_text() << ") ---\n"
              << std::flush;
    }
  }

  // Sends sig to every worker that has not been reaped.
  void stop_all(int sig) {
    for (auto& w : workers_)
      if (w.pid > 0 && !w.done) ::kill(w.pid, sig);
  }

  const LaunchOptions& o_;
  const Start& st_;
  std::vector<Worker> workers_;  // slot i is local worker i; never resized
  OutputRouter router_;
  Watch watch_;
  const Worker* first_failure_ = nullptr;  // the failure that stopped the others
  int interrupted_ = 0;                    // the signal passed on, 0: none
  Clock::time_point interrupted_at_{};
  sig_atomic_t signals_seen_ = 0;  // g_signals counted as the first request
  bool stopping_ = false;
  Clock::time_point kill_at_{};             // when stopping: SIGKILL to whoever is left after this
  std::string stall_, whereabouts_, desync_;  // the diagnosis for the report; empty: none
};

// Starts the workers once and watches them until every one has exited.
Ended run_workers(const LaunchOptions& o, const Start& st) {
  Supervisor workers(o, st);
  workers.start();
  while (workers.running()) {
    workers.route_output();
    const Worker* failure = workers.reap();
    workers.pass_on_signal();
    workers.stop_on_failure(failure);
    workers.stop_on_stall();
    workers.kill_when_due();
  }
  return workers.report();
}

}  // namespace

WorkerEnv worker_env() {
  WorkerEnv e;
  auto has = [](const char* n) { return std::getenv(n) != nullptr; };
  if (has("RANK") || has("WORLD_SIZE")) {
    e.source = has("FANOUT_LAUNCHED") ? "fanout" : "torchrun";
    e.rank = parse_env_int("RANK", 0);
    e.world_size = parse_env_int("WORLD_SIZE", 1);
    e.local_rank = has("LOCAL_RANK") ? parse_env_int("LOCAL_RANK", 0) : 0;
    e.local_world_size = has("LOCAL_WORLD_SIZE") ? parse_env_int("LOCAL_WORLD_SIZE", 1) : 1;
  } else if (has("OMPI_COMM_WORLD_RANK")) {
    e.source = "mpirun";
    e.rank = parse_env_int("OMPI_COMM_WORLD_RANK", 0);
    e.world_size = parse_env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = has("OMPI_COMM_WORLD_LOCAL_RANK") ? parse_env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0) : 0;
    e.local_world_size = has("OMPI_COMM_WORLD_LOCAL_SIZE") ? parse_env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1) : 1;
  } else if (has("SLURM_PROCID") && has("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = parse_env_int("SLURM_PROCID", 0);
    e.world_size = parse_env_int("SLURM_NTASKS", 1);
    e.local_rank = has("SLURM_LOCALID") ? parse_env_int("SLURM_LOCALID", 0) : 0;
    e.local_world_size = has("SLURM_NTASKS_PER_NODE") ? parse_env_int("SLURM_NTASKS_PER_NODE", 1) : 1;
  } else {
    return e;
  }
  e.present = true;
  FANOUT_USER_CHECK(e.rank < e.world_size)
      << e.source << " rank " << e.rank << " is outside its world size " << e.world_size;
  FANOUT_USER_CHECK(e.local_rank < e.local_world_size)
      << e.source << " local rank " << e.local_rank << " is outside its local world size " << e.local_world_size;
  if (const char* r = std::getenv("FANOUT_RDZV")) e.rendezvous = r;
  if (const char* r = std::getenv("FANOUT_RUN_ID")) e.run_id = r;
  return e;
}

std::string random_run_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

int launch(const LaunchOptions& o) {
  FANOUT_USER_CHECK(o.nproc_per_node >= 1) << "--nproc-per-node must be at least 1, got " << o.nproc_per_node;
  FANOUT_USER_CHECK(o.nnodes >= 1) << "--nnodes must be at least 1, got " << o.nnodes;
  FANOUT_USER_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes)
      << "--node-rank " << o.node_rank << " is outside 0.." << o.nnodes - 1;
  FANOUT_USER_CHECK(o.nnodes == 1 || !o.rendezvous.empty())
      << "several machines (--nnodes " << o.nnodes << ") need a shared rendezvous: --rdzv redis:HOST:PORT";
  FANOUT_USER_CHECK(o.nnodes == 1 || !o.run_id.empty())
      << "several machines (--nnodes " << o.nnodes << ") need the same --run-id on every machine";
  FANOUT_USER_CHECK(o.max_restarts >= 0) << "--max-restarts must be at least 0, got " << o.max_restarts;
  FANOUT_USER_CHECK(o.max_restarts == 0 || o.nnodes == 1)
      << "--max-restarts restarts the workers of one machine; with --nnodes " << o.nnodes
      << " the machines' launchers would restart apart";
  const int world = o.nnodes * o.nproc_per_node;
  const std::string run_id = o.run_id.empty() ? random_run_id() : o.run_id;

  // Rendezvous: a fresh directory unless given; checked before any worker starts.
  std::string rdzv = o.rendezvous, temp_dir;
  if (rdzv.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fanout-rdzv-XXXXXX";
    FANOUT_USER_CHECK(::mkdtemp(tmpl.data()) != nullptr) << "cannot create a rendezvous directory in "
                                                         << (tmp && *tmp ? tmp : "/tmp") << ": " << strerror(errno);
    temp_dir = tmpl;
    rdzv = "file:" + temp_dir;
  }
  struct RemoveDir {
    std::string d;
    ~RemoveDir() {
      std::error_code ec;
      if (!d.empty()) fs::remove_all(d, ec);
    }
  } remove_dir{temp_dir};
  probe_rendezvous(Rendezvous::parse(rdzv), o.stall_s > 0 ? o.stall_s : 10);
  if (!o.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.log_dir, ec);
    FANOUT_USER_CHECK(!ec && fs::is_directory(o.log_dir)) << "cannot create --log-dir " << o.log_dir;
    std::string probe = o.log_dir + "/.fanout-probe-XXXXXX";  // as the logs will be opened (access() trusts root)
    const int fd = ::mkstemp(probe.data());
    FANOUT_USER_CHECK(fd >= 0) << "--log-dir " << o.log_dir << " is not writable (" << std::strerror(errno) << ")";
    ::close(fd);
    ::unlink(probe.c_str());
  }
  LogDirLock log_lock(o.log_dir, o.node_rank);
  const std::vector<std::string> extra_env = o.before_start ? o.before_start() : std::vector<std::string>{};

  // The environment every worker gets, less its identity (set per worker).
  const char* ours[] = {"RANK=",         "LOCAL_RANK=",    "WORLD_SIZE=",    "LOCAL_WORLD_SIZE=",
                        "GROUP_RANK=",   "FANOUT_RDZV=",   "FANOUT_RUN_ID=", "FANOUT_LAUNCHED=",
                        "FANOUT_STDERR_TTY=", "FANOUT_RESTART_COUNT=", "FANOUT_PROGRESS_FD=", "FANOUT_SAVE_DIR_LOCK=",
                        "OMPI_COMM_WORLD_RANK=", "SLURM_PROCID="};
  Start st;
  for (char** e = environ; *e; ++e) {
    bool skip = false;
    for (const char* p : ours) skip = skip || std::strncmp(*e, p, std::strlen(p)) == 0;
    if (!skip) st.base_env.push_back(*e);
  }
  st.base_env.insert(st.base_env.end(), extra_env.begin(), extra_env.end());
  st.tty = ::isatty(STDERR_FILENO);
  st.rdzv = rdzv;
  st.world = world;
  ProgressBoard board(o.nproc_per_node);
  st.board = &board;

  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  g_signal = 0;
  g_signals = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  struct Restore {
    struct sigaction i, t;
    ~Restore() {
      sigaction(SIGINT, &i, nullptr);
      sigaction(SIGTERM, &t, nullptr);
    }
  } restore{old_int, old_term};

  // Rank 0's machine prints the run; another says what it runs, and that it finished.
  const int first = o.node_rank * o.nproc_per_node, last = first + o.nproc_per_node - 1;
  const std::string machine = o.name + ": machine " + std::to_string(o.node_rank) + " of " + std::to_string(o.nnodes) +
                              ": rank" + (first == last ? " " + std::to_string(first)
                                                        : "s " + std::to_string(first) + ".." + std::to_string(last)) +
                              " of " + std::to_string(world);
  if (o.node_rank > 0) std::printf("%s (rank 0's machine prints the run's progress)\n", machine.c_str());
  std::fflush(stdout);  // before the workers fork
  std::string last_error, last_progress = o.progress ? o.progress() : "";
  for (;;) {
    // Each start has keys of its own in the rendezvous: a restart never meets the last one's.
    st.run_id = st.restart == 0 ? run_id : run_id + "/restart-" + std::to_string(st.restart);
    board.clear();
    const Ended r = run_workers(o, st);
    if (r.code == 0 && o.node_rank > 0) std::printf("%s: finished\n", machine.c_str()), std::fflush(stdout);
    if (r.code == 0 || r.interrupted || o.max_restarts == 0) return r.code;
    if (st.restart == o.max_restarts) {
      std::fprintf(stderr, "%s: no restarts left (--max-restarts %d)\n", o.name.c_str(), o.max_restarts);
      return r.code;
    }
    // An error that a restart repeats word for word, having saved nothing new, is the run's (its input,
    // its options), not the machine's: another restart would end the same way.
    const std::string progress = o.progress ? o.progress() : "";
    if (!r.error.empty() && r.error == last_error && progress == last_progress) {
      std::fprintf(stderr, "%s: the restart ended with the same error and saved nothing new: not restarting again\n",
                   o.name.c_str());
      return r.code;
    }
    last_error = r.error;
    last_progress = progress;
    ++st.restart;
    std::fprintf(stderr, "%s: restarting the workers (restart %d of %d)\n", o.name.c_str(), st.restart,
                 o.max_restarts);
  }
}

}  // namespace fanout::distributed
