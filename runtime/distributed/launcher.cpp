// Worker launcher: fork/exec per local rank, pipes for their output, a poll
// loop that routes output and reaps workers, and a stop sequence on failure.
#include "runtime/distributed/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "runtime/core/error.h"
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

std::string describe(const Worker& w) {
  std::string s = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ")";
  if (WIFSIGNALED(w.status)) {
    const int sig = WTERMSIG(w.status);
    s += " was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  } else {
    s += " exited with status " + std::to_string(WEXITSTATUS(w.status));
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
};

// Starts the workers once and watches them until every one has exited.
Ended run_workers(const LaunchOptions& o, const Start& st) {
  std::vector<std::string> argv{o.program};
  argv.insert(argv.end(), o.args.begin(), o.args.end());

  std::vector<Worker> workers(o.nproc_per_node);
  auto stop_all = [&](int sig) {
    for (auto& w : workers)
      if (w.pid > 0 && !w.done) ::kill(w.pid, sig);
  };
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = workers[i];
    w.rank = o.node_rank * o.nproc_per_node + i;
    std::vector<std::string> env_s = st.base_env;
    env_s.push_back("RANK=" + std::to_string(w.rank));
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
      for (auto& x : workers)
        if (x.pid > 0) ::waitpid(x.pid, nullptr, 0);
      throw;
    }
    ::close(out[1]);
    ::close(err[1]);
    w.pid = pid;
    w.out = out[0];
    w.err = err[0];
    if (!o.log_dir.empty()) w.log.open(o.log_dir + "/rank-" + std::to_string(w.rank) + ".log", std::ios::trunc);
  }

  // Route output and reap workers until every one has exited and its pipes are drained.
  using Clock = std::chrono::steady_clock;
  const Worker* first_failure = nullptr;
  int interrupted = 0;
  Clock::time_point interrupted_at{};
  sig_atomic_t signals_seen = 0;
  bool stopping = false;
  Clock::time_point kill_at{};
  std::vector<char> buf(1 << 16);

  // A worker's stderr: rank 0's passes through as it comes (its progress
  // bar's \r included), the others' line by line with a "[rank N] " prefix.
  // Error lines ("NAME: error: ...") are held back: the report below shows
  // each different one once, not once per rank and again in the summary.
  const std::string err_prefix = o.name + ": error: ", internal_prefix = o.name + ": internal error: ";
  auto is_error = [&](const std::string& t) { return t.starts_with(err_prefix) || t.starts_with(internal_prefix); };
  auto route_line = [&](Worker& w, const std::string& seg) {  // seg: one line, with its terminator if any
    std::string text = seg;
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!last_line(text).empty()) w.last_error = last_line(text);
    if (is_error(text)) {
      w.error_line = text;
    } else if (w.rank == 0) {
      write_all(STDERR_FILENO, seg.data(), seg.size());
    } else {
      const std::string line = "[rank " + std::to_string(w.rank) + "] " + text + "\n";
      write_all(STDERR_FILENO, line.data(), line.size());
    }
  };
  auto route_err = [&](Worker& w, bool more) {  // more: the pipe is still open
    const char* ends = w.rank == 0 ? "\r\n" : "\n";
    size_t start = 0, end;
    while ((end = w.err_line.find_first_of(ends, start)) != std::string::npos) {
      route_line(w, w.err_line.substr(start, end + 1 - start));
      start = end + 1;
    }
    w.err_line.erase(0, start);
    const std::string& rest = w.err_line;
    const bool may_be_error = is_error(rest) || err_prefix.starts_with(rest) || internal_prefix.starts_with(rest);
    if (!rest.empty() && (!more || (w.rank == 0 && !may_be_error))) {
      route_line(w, rest);  // rank 0's partial line shows at once unless it may be an error line
      w.err_line.clear();
    }
  };

  // A rank that keeps the others waiting: stopped (SIGSTOP, a debugger) or
  // outside any collective for `after` seconds while another waits inside
  // one, or behind `failed` (a rank that ended, as a collective timed out).
  std::vector<Clock::time_point> stopped_since(workers.size());
  std::string stall, whereabouts, desync;
  auto where = [&](size_t j) {
    if (!workers[j].done) return st.board->describe(static_cast<int>(j), workers[j].rank);
    const ProgressBoard::Seen seen = st.board->read(static_cast<int>(j));
    const std::string rank = "rank " + std::to_string(workers[j].rank);
    if (seen.entered == 0) return rank + " ended before any collective";
    if (seen.failed) return st.board->describe(static_cast<int>(j), workers[j].rank);
    return rank + " ended after " + seen.what + " (collective #" + std::to_string(seen.id()) + ")";
  };
  // Whether a running rank waits inside a collective now.
  auto someone_inside = [&] {
    for (size_t i = 0; i < workers.size(); ++i)
      if (!workers[i].done && st.board->read(static_cast<int>(i)).inside > 0) return true;
    return false;
  };
  // Where the ranks are, from the progress board: one clause per rank.
  // Worth a line when a rank still waits in a collective (not after a bad option, say).
  auto where_all = [&] {
    std::string s;
    if (!st.board || !someone_inside()) return s;
    for (size_t i = 0; i < workers.size(); ++i) s += (s.empty() ? "" : "; ") + where(i);
    return s;
  };
  auto find_stall = [&](double after, const Worker* failed) -> std::string {
    const uint64_t failed_at = failed ? st.board->read(static_cast<int>(failed - workers.data())).entered : 0;
    const bool someone_waits = failed_at > 0 || someone_inside();
    for (size_t i = 0; i < workers.size(); ++i) {
      const Worker& w = workers[i];
      if (w.done) continue;
      const char state = proc_state(w.pid);
      if (state != 'T' && state != 't') stopped_since[i] = {};
      else if (stopped_since[i] == Clock::time_point{}) stopped_since[i] = Clock::now();
      if (!someone_waits) continue;
      const ProgressBoard::Seen seen = st.board->read(static_cast<int>(i));
      const double stopped_s =
          stopped_since[i] == Clock::time_point{} ? 0 : std::chrono::duration<double>(Clock::now() - stopped_since[i]).count();
      const bool behind = !failed || seen.entered < failed_at;
      char head[160];
      // The board's idle clock starts at the rank's last step, before the
      // launcher first sees it stopped: a stopped rank may be idle long
      // enough first, and is still named as stopped.
      const char* stopped = stopped_since[i] == Clock::time_point{} ? "" : " is stopped (SIGSTOP or a debugger) and";
      if (stopped_s >= after)
        std::snprintf(head, sizeof head, "rank %d (pid %d) is stopped (SIGSTOP or a debugger) for %.0f s", w.rank,
                      static_cast<int>(w.pid), stopped_s);
      else if (seen.inside == 0 && seen.idle_s >= after && behind)
        std::snprintf(head, sizeof head, "rank %d (pid %d)%s has made no progress for %.0f s", w.rank,
                      static_cast<int>(w.pid), stopped, seen.idle_s);
      else
        continue;
      std::string others;
      for (size_t j = 0; j < workers.size(); ++j)
        if (j != i) others += "; " + where(j);
      return std::string(head) + ": " + where(i) + others;
    }
    return {};
  };

  // Ranks stuck in (or failed in) collectives of different numbers: one
  // skipped or added a collective. The Gloo group's tags make such ranks
  // wait for each other instead of mixing their buffers.
  auto find_desync = [&]() -> std::string {
    std::vector<size_t> stuck;
    for (size_t i = 0; i < workers.size(); ++i) {
      const ProgressBoard::Seen seen = st.board->read(static_cast<int>(i));
      if (seen.failed || (!workers[i].done && seen.inside > 0)) stuck.push_back(i);
    }
    // The group's own numbers (Gloo's, per tag) when it gives them: a skipped
    // collective shifts them, not the count of collectives begun.
    auto number = [&](size_t i) { return st.board->read(static_cast<int>(i)).id(); };
    bool differ = false;
    for (size_t i : stuck) differ = differ || number(i) != number(stuck[0]);
    if (!differ) return {};
    std::string s = "the ranks' collectives are out of step (a rank skipped or added one; every rank must make the same "
                    "collectives in the same order): ";
    for (size_t k = 0; k < stuck.size(); ++k) s += (k ? "; " : "") + where(stuck[k]);
    return s;
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, bool>> who;  // worker, is stderr
    for (auto& w : workers) {
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0}), who.emplace_back(&w, false);
      if (w.err >= 0) fds.push_back({w.err, POLLIN, 0}), who.emplace_back(&w, true);
    }
    bool all_done = true;
    for (auto& w : workers) all_done = all_done && w.done;
    if (fds.empty() && all_done) break;
    ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Worker& w = *who[k].first;
      const bool is_err = who[k].second;
      const ssize_t n = ::read(fds[k].fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fds[k].fd);
        (is_err ? w.err : w.out) = -1;
        if (is_err) route_err(w, false);
        continue;
      }
      if (w.log.is_open()) w.log.write(buf.data(), n).flush();
      if (!is_err) {
        if (w.rank == 0) write_all(STDOUT_FILENO, buf.data(), static_cast<size_t>(n));
        continue;
      }
      w.err_line.append(buf.data(), static_cast<size_t>(n));
      route_err(w, true);
    }
    // Reap; among workers that ended in the same round, one killed by a
    // signal is the likelier cause (the others saw it go and failed after).
    const Worker* round_failure = nullptr;
    for (auto& w : workers) {
      if (w.done) continue;
      int st = 0;
      if (::waitpid(w.pid, &st, WNOHANG) != w.pid) continue;
      w.done = true;
      w.status = st;
      if (failed(w) && (!round_failure || (WIFSIGNALED(w.status) && !WIFSIGNALED(round_failure->status))))
        round_failure = &w;
    }
    if (!interrupted && g_signal) {
      // Passed on: the workers stop after their step and save; a second signal kills them.
      interrupted = g_signal;
      interrupted_at = Clock::now();
      stop_all(interrupted);
      if (!stopping) kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_s * 1000));
      stopping = true;
    }
    // Repeats within a second are the same request (timeout(1) signals the
    // process and then its group: one timeout, two signals).
    if (interrupted && Clock::now() - interrupted_at < std::chrono::seconds(1)) signals_seen = g_signals;
    if (interrupted && g_signals > signals_seen) kill_at = Clock::now();
    if (round_failure && !first_failure && !stopping) {
      first_failure = round_failure;
      whereabouts = where_all();
      // A collective that timed out on one rank because another stalls: name the one that stalls.
      if (o.stall_s > 0 && st.board) stall = find_stall(o.stall_s / 2, round_failure);
      if (stall.empty() && st.board && !WIFSIGNALED(round_failure->status)) desync = find_desync();
      stopping = true;
      stop_all(stall.empty() ? SIGTERM : SIGKILL);
      kill_at = Clock::now() + std::chrono::milliseconds(stall.empty() ? static_cast<int64_t>(o.grace_s * 1000) : 0);
    }
    if (!stopping && o.stall_s > 0 && st.board) {
      stall = find_stall(o.stall_s, nullptr);
      if (!stall.empty()) {
        stopping = true;
        stop_all(SIGKILL);  // a stopped or stuck process would not act on SIGTERM
        kill_at = Clock::now();
      }
    }
    if (stopping && Clock::now() > kill_at) {
      stop_all(SIGKILL);
      // Pipes of killed workers close; anything their children hold open must not keep us here.
      for (auto& w : workers)
        if (w.done && w.err < 0 && w.out >= 0) ::close(w.out), w.out = -1;
    }
  }

  // The held-back error lines: the first failure's in the summary, the others' when they differ from it.
  const std::string first_error =
      first_failure && !WIFSIGNALED(first_failure->status) ? first_failure->error_line : std::string();
  for (auto& w : workers) {
    if (w.error_line.empty() || w.error_line == first_error) continue;
    const std::string line = "[rank " + std::to_string(w.rank) + "] " + w.error_line + "\n";
    write_all(STDERR_FILENO, line.data(), line.size());
  }
  if (interrupted) {
    std::fprintf(stderr, "%s: interrupted (%s): stopped %d worker%s\n", o.name.c_str(), strsignal(interrupted),
                 o.nproc_per_node, o.nproc_per_node == 1 ? "" : "s");
    return {128 + interrupted, true};
  }
  if (!stall.empty()) {
    if (first_failure && !first_error.empty()) {
      const std::string line = "[rank " + std::to_string(first_failure->rank) + "] " + first_error + "\n";
      write_all(STDERR_FILENO, line.data(), line.size());
    }
    std::fprintf(stderr, "%s: %s; stopped the workers (--timeout %g s)\n", o.name.c_str(), stall.c_str(), o.stall_s);
    return {124, false};
  }
  if (first_failure && !desync.empty()) {
    if (!first_error.empty()) {
      const std::string line = "[rank " + std::to_string(first_failure->rank) + "] " + first_error + "\n";
      write_all(STDERR_FILENO, line.data(), line.size());
    }
    std::fprintf(stderr, "%s: %s; stopped the workers\n", o.name.c_str(), desync.c_str());
    return {WIFSIGNALED(first_failure->status) ? 128 + WTERMSIG(first_failure->status) : WEXITSTATUS(first_failure->status),
            false};
  }
  if (first_failure) {
    if (!whereabouts.empty()) std::fprintf(stderr, "%s: when it failed: %s\n", o.name.c_str(), whereabouts.c_str());
    if (!first_error.empty())
      std::fprintf(stderr, "%s (rank %d; stopped the other workers)\n", first_error.c_str(), first_failure->rank);
    else
      std::fprintf(stderr, "%s: %s; stopped the other workers\n", o.name.c_str(), describe(*first_failure).c_str());
    return {WIFSIGNALED(first_failure->status) ? 128 + WTERMSIG(first_failure->status)
                                               : WEXITSTATUS(first_failure->status),
            false};
  }
  return {0, false};
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
  probe_rendezvous(Rendezvous::parse(rdzv), 10);
  if (!o.log_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.log_dir, ec);
    FANOUT_USER_CHECK(!ec && fs::is_directory(o.log_dir)) << "cannot create --log-dir " << o.log_dir;
  }

  // The environment every worker gets, less its identity (set per worker).
  const char* ours[] = {"RANK=",         "LOCAL_RANK=",    "WORLD_SIZE=",    "LOCAL_WORLD_SIZE=",
                        "GROUP_RANK=",   "FANOUT_RDZV=",   "FANOUT_RUN_ID=", "FANOUT_LAUNCHED=",
                        "FANOUT_STDERR_TTY=", "FANOUT_RESTART_COUNT=", "FANOUT_PROGRESS_FD=", "OMPI_COMM_WORLD_RANK=", "SLURM_PROCID="};
  Start st;
  for (char** e = environ; *e; ++e) {
    bool skip = false;
    for (const char* p : ours) skip = skip || std::strncmp(*e, p, std::strlen(p)) == 0;
    if (!skip) st.base_env.push_back(*e);
  }
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

  for (;;) {
    // Each start has keys of its own in the rendezvous: a restart never meets the last one's.
    st.run_id = st.restart == 0 ? run_id : run_id + "/restart-" + std::to_string(st.restart);
    board.clear();
    const Ended r = run_workers(o, st);
    if (r.code == 0 || r.interrupted || o.max_restarts == 0) return r.code;
    if (st.restart == o.max_restarts) {
      std::fprintf(stderr, "%s: no restarts left (--max-restarts %d)\n", o.name.c_str(), o.max_restarts);
      return r.code;
    }
    ++st.restart;
    std::fprintf(stderr, "%s: restarting the workers (restart %d of %d)\n", o.name.c_str(), st.restart,
                 o.max_restarts);
  }
}

}  // namespace fanout::distributed
