// Comm over host memory for CPU devices. Reductions are done by the last rank
// to arrive, adding the ranks' buffers in rank order, so results do not depend
// on thread timing.
#include <cstring>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/worker_pool.h"

namespace fanout {
namespace {

class CpuComm : public Comm {
 public:
  CpuComm(int ranks, int max_ops)
      : ranks_(ranks), slots_(ranks), op_bufs_(max_ops, std::vector<Tensor>(ranks)), op_count_(max_ops, 0) {}
  std::string name() const override { return "cpu"; }

  void begin(int active) override {
    active_ = active;
    barrier_.reset(active);
    for (auto& c : op_count_) c = 0;
  }

  void broadcast(int rank, Tensor& buf, Context&) override {
    slots_[rank] = buf;
    barrier_.arrive_and_wait();
    if (rank != 0) {
      FANOUT_CHECK(slots_[0].numel() == buf.numel()) << "broadcast of mismatched sizes";
      std::memcpy(buf.raw(), slots_[0].raw(), buf.nbytes());
    }
    barrier_.arrive_and_wait();
  }

  void reduce_add(int op, int rank, const Tensor& buf, Context&, int root) override {
    FANOUT_CHECK(op >= 0 && op < static_cast<int>(op_bufs_.size())) << "reduce op " << op;
    FANOUT_CHECK(root >= 0 && root < active_) << "reduce onto rank " << root << " of " << active_;
    {
      std::lock_guard<std::mutex> g(mu_);
      op_bufs_[op][rank] = buf;
      if (++op_count_[op] < active_) return;
      op_count_[op] = 0;
    }
    // Last to arrive: every rank's buffer for this op is final.
    auto& bufs = op_bufs_[op];
    if (bufs[0].dtype() == DType::F64) add_ranks<double>(bufs, root);
    else add_ranks<float>(bufs, root);
  }

  // Rank 0 adds the others' buffers into its own, in rank order, while they
  // wait; then they copy the sum. No memory is shared beyond the buffers.
  void all_reduce(int rank, Tensor& buf, Context&) override {
    slots_[rank] = buf;
    barrier_.arrive_and_wait();  // every rank's input is posted
    if (rank == 0) {
      FANOUT_CHECK(buf.dtype() == DType::F32 || buf.dtype() == DType::F64)
          << "all_reduce of " << dtype_name(buf.dtype());
      for (int r = 1; r < active_; ++r)
        FANOUT_CHECK(slots_[r].numel() == buf.numel() && slots_[r].dtype() == buf.dtype())
            << "all_reduce of mismatched buffers";
      if (buf.dtype() == DType::F64) add_ranks<double>(slots_, 0);
      else add_ranks<float>(slots_, 0);
    }
    barrier_.arrive_and_wait();  // the sum is in rank 0's buffer
    if (rank != 0) std::memcpy(buf.raw(), slots_[0].raw(), buf.nbytes());
    barrier_.arrive_and_wait();  // every rank has its copy before rank 0's buffer is used again
  }

  void abort() override { barrier_.abort(); }

 private:
  template <class T>
  void add_ranks(const std::vector<Tensor>& bufs, int root) {
    const int64_t n = bufs[0].numel();
    for (int r = 1; r < active_; ++r)
      FANOUT_CHECK(bufs[r].dtype() == bufs[0].dtype() && bufs[r].numel() == n) << "reduce of mismatched buffers";
    T* dst = bufs[root].data<T>();
    if (root == 0) {
      for (int r = 1; r < active_; ++r) {
        const T* src = bufs[r].data<T>();
        for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      }
      return;
    }
    // ((b0 + b1) + b2) + ... as with root 0, element by element (root's own input is read before it is written).
    for (int64_t i = 0; i < n; ++i) {
      T sum = bufs[0].data<T>()[i];
      for (int r = 1; r < active_; ++r) sum += bufs[r].data<T>()[i];
      dst[i] = sum;
    }
  }


  int ranks_;
  int active_ = 1;
  AbortableBarrier barrier_;
  std::mutex mu_;
  std::vector<Tensor> slots_;
  std::vector<std::vector<Tensor>> op_bufs_;
  std::vector<int> op_count_;
};

}  // namespace

std::unique_ptr<Comm> make_cpu_comm(int ranks, int max_ops) { return std::make_unique<CpuComm>(ranks, max_ops); }

}  // namespace fanout
