// Launcher: starts the workers of a distributed run on this machine, one
// process per rank, with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK) plus the rendezvous, and watches them:
// rank 0's standard output and error pass through; the other ranks'
// standard error is passed on with a "[rank N] " prefix; with a log directory each rank's
// output is also kept in rank-N.log. If a worker dies or exits non-zero, the
// others are stopped (SIGTERM, then SIGKILL after a grace period) and the
// launch fails naming the rank and its last error line. Workers are killed
// with the launcher (PR_SET_PDEATHSIG), so none is ever left behind. With
// max_restarts, a failed start is followed by another.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace fanout::distributed {

// The worker identity a launcher gave this process, if any.
struct WorkerEnv {
  bool present = false;
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string source;      // "fanout", "torchrun", "mpirun" or "slurm"
  std::string rendezvous;  // FANOUT_RDZV, when set
  std::string run_id;      // FANOUT_RUN_ID, when set
};
// Reads RANK/WORLD_SIZE (ours and torchrun's), OMPI_COMM_WORLD_RANK/SIZE
// (mpirun) or SLURM_PROCID/SLURM_NTASKS (Slurm). Malformed values are a
// one-line error.
WorkerEnv worker_env();

struct LaunchOptions {
  std::string program;            // the executable each worker runs
  std::vector<std::string> args;  // its arguments (argv[1..])
  int nproc_per_node = 1;
  int nnodes = 1, node_rank = 0;
  std::string rendezvous;         // file:DIR or redis:HOST:PORT; empty: a fresh directory, removed after
  std::string run_id;             // empty: a fresh random one
  std::string log_dir;            // empty: no per-rank logs
  double grace_s = 5;             // SIGTERM to SIGKILL when stopping workers after a failure
  double stop_grace_s = 120;      // after a forwarded SIGTERM/SIGINT: time to finish a step and save
  std::string name = "dp-train";  // prefix of the launcher's own messages
  // After a worker fails, stop the others and start them all again, up to
  // max_restarts times (torchrun's --max-restarts). Restart n's workers get
  // FANOUT_RESTART_COUNT=n (where to continue from is theirs to find) and keys
  // of their own in the rendezvous.
  int max_restarts = 0;
  // A rank that keeps the others waiting in a collective this long (stopped,
  // or outside any collective) is named and every worker stopped; the launch
  // returns 124. 0: off. dp-train passes its --timeout.
  double stall_s = 0;
  // Called once the options and the rendezvous are checked, before the first
  // worker starts; returns NAME=VALUE entries added to every worker's
  // environment (dp-train locks its save directory for its workers here).
  std::function<std::vector<std::string>()> before_start;
  // What the run has saved so far (dp-train: its newest checkpoint's name): a
  // restart that ends with the error its start ended with, word for word, and
  // saved nothing new ends the restarts (another would fail the same way).
  std::function<std::string()> progress;
};

// Runs the workers to completion. Returns 0 when all succeed, otherwise the
// failing worker's exit status (128 + signal when it was killed); the cause
// is printed on stderr. SIGINT or SIGTERM to the launcher is passed on to the
// workers (each in its own process group, so a terminal's Ctrl-C reaches
// them once, through the launcher), which stop after their step and save;
// they are killed if they have not exited after stop_grace_s, or at once on
// a second signal. The launcher then returns 128 + the signal (no restart).
int launch(const LaunchOptions& opts);

// A fresh run id: 16 hex digits from the system's random source.
std::string random_run_id();

}  // namespace fanout::distributed
