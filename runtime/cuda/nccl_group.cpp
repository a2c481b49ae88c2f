// Process group over NCCL: one rank per process and device. Rank 0 makes the
// unique id and publishes it through the rendezvous store. The communicator
// is non-blocking (ncclConfig_t::blocking = 0): initialization and every
// collective are polled against the timeout, and a peer that died or hangs
// makes the call abort the communicator and throw, never wait forever.
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/cuda/cuda_check.h"
#include "runtime/distributed/process_group.h"
#include "runtime/distributed/progress_board.h"
#include "runtime/distributed/store.h"

namespace fanout::distributed {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t, const std::string& what) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I64: return ncclInt64;
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
  }
  FANOUT_FAIL() << what << ": unsupported dtype";
}

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(const GroupOptions& o, Device device) : ProcessGroup(o.rank, o.world_size, o.timeout_s), device_(device) {
    FANOUT_USER_CHECK(device.is_cuda()) << "the NCCL process group needs a CUDA device, got " << device.str();
    FANOUT_USER_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size)
        << "rank " << o.rank << " is outside a world of " << o.world_size;
    FANOUT_CUDA_CHECK(cudaSetDevice(device.index));
    FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const Rendezvous r = Rendezvous::parse(o.rendezvous);
    auto store = open_store(r, o.run_id, o.timeout_s);
    ncclUniqueId id;
    const std::string key = "nccl_unique_id";
    try {
      if (rank_ == 0) {
        FANOUT_NCCL_CHECK(ncclGetUniqueId(&id));
        store->set(key, std::vector<char>(reinterpret_cast<char*>(&id), reinterpret_cast<char*>(&id) + sizeof id));
      } else {
        store->wait({key}, std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
        const auto bytes = store->get(key);
        FANOUT_CHECK(bytes.size() == sizeof id) << "NCCL unique id of " << bytes.size() << " bytes";
        std::memcpy(&id, bytes.data(), sizeof id);
      }
    } catch (const fanout::Error&) {
      throw;
    } catch (const std::exception& e) {
      FANOUT_FAIL() << "NCCL rendezvous over " << r.str() << " failed on rank " << rank_ << " of " << size_ << ": "
                    << first_line(e.what());
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t st = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    FANOUT_CHECK(st == ncclSuccess || st == ncclInProgress) << "ncclCommInitRankConfig: " << ncclGetErrorString(st);
    wait_comm("NCCL communicator initialization");
    // Every rank has joined, so every rank has read the id: clear it for a later run with this id.
    if (rank_ == 0) forget_keys(r, o.run_id, {key});
  }

  ~NcclGroup() override {
    if (comm_) ncclCommAbort(comm_);  // abort, not destroy: never blocks on a dead peer
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }
  bool host_memory() const override { return false; }

  void broadcast(Tensor& buf, int root, const std::string& what, uint32_t) override {
    check(buf, what);
    CollectiveMark mark(what, buf.numel(), ++seq_);
    enqueue(what, ncclBroadcast(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf.dtype(), what),
                                root, comm_, stream_));
    wait_stream(what);
  }
  void all_reduce(Tensor& buf, const std::string& what, uint32_t) override {
    check(buf, what);
    count_summed(buf);
    CollectiveMark mark(what, buf.numel(), ++seq_);
    enqueue(what, ncclAllReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf.dtype(), what),
                                ncclSum, comm_, stream_));
    wait_stream(what);
  }
  void reduce(Tensor& buf, int root, const std::string& what, uint32_t) override {
    check(buf, what);
    count_summed(buf);
    CollectiveMark mark(what, buf.numel(), ++seq_);
    enqueue(what, ncclReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf.dtype(), what),
                             ncclSum, root, comm_, stream_));
    wait_stream(what);
  }
  void all_gather(const Tensor& in, Tensor& out, const std::string& what, uint32_t) override {
    check(in, what);
    check(out, what);
    FANOUT_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_)
        << what << ": all-gather of " << in.shape().str() << " into " << out.shape().str();
    CollectiveMark mark(what, out.numel(), ++seq_);
    enqueue(what, ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()), nccl_type(in.dtype(), what),
                                comm_, stream_));
    wait_stream(what);
  }
  void barrier(const std::string& what, uint32_t tag) override {
    Tensor one = Tensor::zeros(Shape{1}, DType::F32, device_);
    all_reduce(one, what, tag);
  }

 private:
  void check(const Tensor& t, const std::string& what) {
    FANOUT_CHECK(comm_) << what << ": the NCCL group failed earlier";
    FANOUT_CHECK(t.defined() && t.device() == device_)
        << what << ": tensor on " << t.device().str() << ", the group's device is " << device_.str();
    FANOUT_CUDA_CHECK(cudaSetDevice(device_.index));
  }
  void enqueue(const std::string& what, ncclResult_t st) {
    if (st == ncclSuccess || st == ncclInProgress) return;
    fail(what, ncclGetErrorString(st));
  }
  // Polls until the communicator leaves ncclInProgress, or the deadline.
  void wait_comm(const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (;;) {
      ncclResult_t async = ncclSuccess;
      FANOUT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) fail(what, ncclGetErrorString(async));
      if (Clock::now() > deadline) fail(what, "timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // Waits until the collective is on the stream (a non-blocking
  // communicator may still be enqueuing it, with the stream empty:
  // ncclInProgress until it is), then polls the stream and the
  // communicator's error state until it completes.
  void wait_stream(const std::string& what) {
    wait_comm(what);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(what, cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      FANOUT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) fail(what, ncclGetErrorString(async));
      if (Clock::now() > deadline) fail(what, "timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  [[noreturn]] void fail(const std::string& what, const std::string& cause) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    FANOUT_FAIL() << what << " failed on rank " << rank_ << " of " << size_ << " (NCCL, its collective #" << seq_
                  << "; timeout " << timeout_s_ << " s): " << cause;
  }

  Device device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  uint64_t seq_ = 0;  // collectives so far: one stream runs them in order, so every rank counts alike
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(const GroupOptions& opts, Device device) {
  return std::make_unique<NcclGroup>(opts, device);
}

}  // namespace fanout::distributed
