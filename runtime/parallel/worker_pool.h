// Persistent worker threads for ranks 1..n-1, each bound to its device once;
// rank 0 (the primary) runs on the calling thread, the one that owns the
// primary, which saves two thread hand-offs per phase (and every hand-off
// with one device). run(fn, active) runs fn(i) for ranks 0..active-1 and
// waits for all of them; the caller's own exception, else the first worker
// exception, is rethrown.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/core/device.h"

namespace fanout {

class WorkerPool {
 public:
  // `bind(i)` runs once on the thread of rank i >= 1 when it starts (sets the CUDA device).
  WorkerPool(const std::vector<Device>& devices, std::function<void(int)> bind);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  void run(const std::function<void(int)>& fn, int active);
  int size() const { return static_cast<int>(threads_.size()) + 1; }  // ranks, the caller's included

 private:
  void loop(int i);
  std::vector<std::thread> threads_;
  std::function<void(int)> bind_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  int active_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// A reusable barrier for a participant count fixed per phase, which can be
// aborted so that no worker waits forever after another one failed.
class AbortableBarrier {
 public:
  void reset(int participants);
  void arrive_and_wait();  // throws fanout::Error once aborted
  void abort();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int participants_ = 1, waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

}  // namespace fanout
