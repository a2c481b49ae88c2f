// Comm over host memory for CPU devices. Reductions are done by the last rank
// to arrive, adding the ranks' buffers in rank order, so results do not depend
// on thread timing.
#include <cstring>

#include "runtime/core/error.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/rank_slots.h"

namespace fanout {
namespace {

class CpuComm : public Comm {
 public:
  CpuComm(int ranks, int max_ops) : ranks_(ranks, max_ops) {}
  std::string name() const override { return "cpu"; }

  void begin(int active) override { ranks_.begin(active); }

  void broadcast(int rank, Tensor& buf, Context&) override {
    ranks_.post_and_wait(rank, buf);
    if (rank != 0) {
      FANOUT_CHECK(ranks_.slot(0).numel() == buf.numel()) << "broadcast of mismatched sizes";
      std::memcpy(buf.raw(), ranks_.slot(0).raw(), buf.nbytes());
    }
    ranks_.wait();
  }

  void reduce_add(int op, int rank, const Tensor& buf, Context&, int root) override {
    FANOUT_CHECK(root >= 0 && root < ranks_.active()) << "reduce onto rank " << root << " of " << ranks_.active();
    if (!ranks_.post_op(op, rank, buf)) return;
    // Last to arrive: every rank's buffer for this op is final.
    const auto& bufs = ranks_.buffers(op);
    if (bufs[0].dtype() == DType::F64) add_ranks<double>(bufs, root);
    else add_ranks<float>(bufs, root);
  }

  // Rank 0 adds the others' buffers into its own, in rank order, while they
  // wait; then they copy the sum. No memory is shared beyond the buffers.
  void all_reduce(int rank, Tensor& buf, Context&) override {
    ranks_.post_and_wait(rank, buf);  // every rank's input is posted
    if (rank == 0) {
      FANOUT_CHECK(buf.dtype() == DType::F32 || buf.dtype() == DType::F64)
          << "all_reduce of " << dtype_name(buf.dtype());
      if (buf.dtype() == DType::F64) add_ranks<double>(ranks_.slots(), 0);
      else add_ranks<float>(ranks_.slots(), 0);
    }
    ranks_.wait();  // the sum is in rank 0's buffer
    if (rank != 0) std::memcpy(buf.raw(), ranks_.slot(0).raw(), buf.nbytes());
    ranks_.wait();  // every rank has its copy before rank 0's buffer is used again
  }

  void abort() override { ranks_.abort(); }

 private:
  // bufs[root] = the active ranks' buffers added in rank order.
  template <class T>
  void add_ranks(const std::vector<Tensor>& bufs, int root) {
    const int64_t n = bufs[0].numel(), active = ranks_.active();
    for (int r = 1; r < active; ++r)
      FANOUT_CHECK(bufs[r].dtype() == bufs[0].dtype() && bufs[r].numel() == n) << "reduce of mismatched buffers";
    T* dst = bufs[root].data<T>();
    if (root == 0) {
      for (int r = 1; r < active; ++r) {
        const T* src = bufs[r].data<T>();
        for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      }
      return;
    }
    // ((b0 + b1) + b2) + ... as with root 0, element by element (root's own input is read before it is written).
    for (int64_t i = 0; i < n; ++i) {
      T sum = bufs[0].data<T>()[i];
      for (int r = 1; r < active; ++r) sum += bufs[r].data<T>()[i];
      dst[i] = sum;
    }
  }

  RankSlots ranks_;
};

}  // namespace

std::unique_ptr<Comm> make_cpu_comm(int ranks, int max_ops) { return std::make_unique<CpuComm>(ranks, max_ops); }

}  // namespace fanout
