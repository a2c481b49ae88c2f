// Progress board: where each worker of this machine is, in memory shared
// with the launcher. A worker's process group marks every collective on its
// slot (entered, left, what, how many elements, when); the launcher reads
// the slots to name a rank that stops making progress (a SIGSTOP, a
// deadlocked data worker) and, when a run fails, where every rank was:
// "rank 1 is in all-reduce of gradient bucket 3 of 7 (collective #812,
// 301056 elements) for 6.0 s; rank 0 is in barrier 'evaluation' ...".
//
// The board is a memfd the launcher creates and its workers inherit
// (FANOUT_PROGRESS_FD); one slot per local rank. Marking a collective costs
// a few atomic stores and one clock read. Without a launcher of ours there is
// no board and marking does nothing.
#pragma once
#include <cstdint>
#include <string>

namespace fanout::distributed {

// Worker side: marks this process's collectives on the launcher's board.
// Collectives may run on several threads at once (DDP's reducer has its own).
class CollectiveMark {
 public:
  // number: the collective's own number in its group (Gloo: among its tag's), 0 when the group has none.
  CollectiveMark(const std::string& what, int64_t elements, uint64_t number = 0);
  ~CollectiveMark();
  CollectiveMark(const CollectiveMark&) = delete;
  CollectiveMark& operator=(const CollectiveMark&) = delete;

 private:
  void* slot_;
  int exceptions_;  // uncaught when the collective began: more at its end means it failed
};

// Launcher side.
class ProgressBoard {
 public:
  explicit ProgressBoard(int slots);  // a fresh board; slots zeroed
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  int fd() const { return fd_; }  // inherited by the workers (not close-on-exec)
  void clear();                   // every slot as new (before a restart)

  struct Seen {
    uint64_t entered = 0;  // collectives begun (0: none yet)
    int inside = 0;        // collectives in flight
    bool failed = false;   // the latest collective ended by an error (a timeout, a dead peer)
    double idle_s = 0;     // seconds since the slot last changed (or since clear())
    std::string what;      // the latest collective begun
    int64_t elements = 0;
    uint64_t number = 0;   // the latest collective's number in its group (0: none given)
    // The number reports give it: the group's own when it gives one, else the count begun.
    uint64_t id() const { return number ? number : entered; }
  };
  Seen read(int slot) const;

  // Where slot's worker (rank `rank`) is, for a report: "rank 1 is in
  // all-reduce of ... (collective #812, 301056 elements) for 20.0 s" or "rank
  // 0 is outside any collective for 20.0 s, after ... (collective #811)".
  std::string describe(int slot, int rank) const;

 private:
  int fd_ = -1;
  int slots_ = 0;
  void* map_ = nullptr;
  int64_t cleared_ns_ = 0;
};

}  // namespace fanout::distributed
