// The rendezvous the in-process communicators share (CPU devices, CUDA
// peer-to-peer): the ranks taking part in a step, a barrier among them, one
// posted buffer per rank, and per reduction op the buffers posted so far,
// reduced by the last rank to post.
#pragma once
#include <algorithm>
#include <mutex>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/parallel/worker_pool.h"

namespace fanout {

class RankSlots {
 public:
  RankSlots(int ranks, int max_ops)
      : slots_(ranks), op_bufs_(max_ops, std::vector<Tensor>(ranks)), op_count_(max_ops, 0) {}

  // A new step over the first `active` ranks.
  void begin(int active) {
    active_ = active;
    barrier_.reset(active);
    std::fill(op_count_.begin(), op_count_.end(), 0);
  }
  int active() const { return active_; }

  // Posts buf as rank's slot, then waits until every active rank has posted.
  void post_and_wait(int rank, const Tensor& buf) {
    slots_[rank] = buf;
    barrier_.arrive_and_wait();
  }
  const Tensor& slot(int rank) const { return slots_[rank]; }
  const std::vector<Tensor>& slots() const { return slots_; }
  void wait() { barrier_.arrive_and_wait(); }  // throws once aborted
  void abort() { barrier_.abort(); }

  // Posts buf for reduction `op`: true for the last active rank to post it,
  // which then finds every rank's buffer in buffers(op).
  bool post_op(int op, int rank, const Tensor& buf) {
    FANOUT_CHECK(op >= 0 && op < static_cast<int>(op_bufs_.size())) << "reduce op " << op;
    std::lock_guard<std::mutex> g(mu_);
    op_bufs_[op][rank] = buf;
    if (++op_count_[op] < active_) return false;
    op_count_[op] = 0;
    return true;
  }
  std::vector<Tensor>& buffers(int op) { return op_bufs_[op]; }

 private:
  int active_ = 1;
  AbortableBarrier barrier_;
  std::mutex mu_;
  std::vector<Tensor> slots_;
  std::vector<std::vector<Tensor>> op_bufs_;
  std::vector<int> op_count_;
};

}  // namespace fanout
