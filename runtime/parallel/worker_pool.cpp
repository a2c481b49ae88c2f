// Worker threads and the abortable barrier.
#include "runtime/parallel/worker_pool.h"

#include "runtime/core/error.h"

namespace fanout {

WorkerPool::WorkerPool(const std::vector<Device>& devices, std::function<void(int)> bind) : bind_(std::move(bind)) {
  FANOUT_CHECK(!devices.empty()) << "a worker pool needs at least one device";
  for (size_t i = 1; i < devices.size(); ++i) threads_.emplace_back([this, i] { loop(static_cast<int>(i)); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::loop(int i) {
  std::exception_ptr bind_error;
  try {
    if (bind_) bind_(i);
  } catch (...) {
    bind_error = std::current_exception();
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (i >= active_) continue;
      job = job_;
    }
    std::exception_ptr err = bind_error;
    if (!err) {
      try {
        (*job)(i);
      } catch (...) {
        err = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

void WorkerPool::run(const std::function<void(int)>& fn, int active) {
  FANOUT_CHECK(active >= 1 && active <= size()) << "run on " << active << " of " << size() << " workers";
  if (active > 1) {
    std::lock_guard<std::mutex> g(mu_);
    job_ = &fn;
    active_ = active;
    pending_ = active - 1;
    error_ = nullptr;
    ++generation_;
    cv_.notify_all();
  }
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  if (active > 1) {
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (!mine) mine = error_;
  }
  if (mine) std::rethrow_exception(mine);
}

void AbortableBarrier::reset(int participants) {
  std::lock_guard<std::mutex> g(mu_);
  participants_ = participants;
  waiting_ = 0;
  aborted_ = false;
}

void AbortableBarrier::arrive_and_wait() {
  std::unique_lock<std::mutex> l(mu_);
  FANOUT_CHECK(!aborted_) << "another replica failed";
  const uint64_t gen = generation_;
  if (++waiting_ == participants_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(l, [&] { return generation_ != gen || aborted_; });
  FANOUT_CHECK(!aborted_ || generation_ != gen) << "another replica failed";
}

void AbortableBarrier::abort() {
  std::lock_guard<std::mutex> g(mu_);
  aborted_ = true;
  cv_.notify_all();
}

}  // namespace fanout
