// Communicators for CUDA replicas.
// p2p: peer copies into staging buffers on the primary plus an add kernel;
//   works with a repeated device and without NCCL. Ranks meet on the host.
// nccl: ncclBroadcast / ncclReduce / ncclAllReduce on one communicator per
//   number of active ranks (created once, then reused), distinct devices only.
// Both synchronize each rank's compute stream before its buffer is read, so a
// bucket is reduced only once the backward kernels that wrote it are done.
#include <nccl.h>

#include <cstring>
#include <map>
#include <mutex>

#include "runtime/core/error.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/rank_slots.h"

namespace fanout {
namespace {

cudaStream_t stream_of(Context& ctx) { return static_cast<cudaStream_t>(ctx.compute().handle()); }

class P2pComm : public Comm {
 public:
  P2pComm(const std::vector<Device>& devices, int max_ops)
      : devices_(devices), ranks_(static_cast<int>(devices.size()), max_ops), staging_(max_ops),
        sums_(devices.size()), acc_(max_ops),
        owner_streams_(devices.size()),
        ready_(max_ops, std::vector<cudaEvent_t>(devices.size(), nullptr)) {
    for (int op = 0; op < max_ops; ++op)
      for (size_t r = 0; r < devices.size(); ++r) {
        FANOUT_CUDA_CHECK(cudaSetDevice(devices[r].index));
        FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[op][r], cudaEventDisableTiming));
      }
  }
  ~P2pComm() override {
    for (auto& evs : ready_)
      for (auto e : evs)
        if (e) cudaEventDestroy(e);
  }
  std::string name() const override { return "p2p"; }

  void begin(int active) override { ranks_.begin(active); }

  void broadcast(int rank, Tensor& buf, Context& ctx) override {
    ranks_.post_and_wait(rank, buf);
    if (rank != 0) {
      FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
      FANOUT_CUDA_CHECK(cudaMemcpyPeerAsync(buf.raw(), devices_[rank].index, ranks_.slot(0).raw(),
                                            devices_[0].index, buf.nbytes(), stream_of(ctx)));
      FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
    }
    ranks_.wait();
  }

  void reduce_add(int op, int rank, const Tensor& buf, Context& ctx, int owner) override {
    const int active = ranks_.active();
    FANOUT_CHECK(owner >= 0 && owner < active) << "reduce onto rank " << owner << " of " << active;
    if (active == 1) return;  // the primary's bucket already is the sum
    // This rank's gradients are final once its stream reaches this event; the
    // owner's stream waits for it instead of the host.
    FANOUT_CUDA_CHECK(cudaEventRecord(ready_[op][rank], stream_of(ctx)));
    if (!ranks_.post_op(op, rank, buf)) return;
    // Last to arrive: stage every other rank's bucket on the owner's device
    // and add, in rank order from rank 0 (the same bits whichever rank owns
    // it), then wait once: the sum is final when this returns.
    auto& bufs = ranks_.buffers(op);
    const int dev = devices_[owner].index;
    FANOUT_CUDA_CHECK(cudaSetDevice(dev));
    cudaStream_t s = owner_stream(owner);
    for (int r = 0; r < active; ++r) FANOUT_CUDA_CHECK(cudaStreamWaitEvent(s, ready_[op][r], 0));
    ensure(staging_[op], bufs[0].shape(), DType::F32, devices_[owner]);
    const size_t n = static_cast<size_t>(bufs[0].numel());
    // The running sum: rank 0's buffer itself when it owns the piece, else a copy of it.
    float* acc = bufs[owner].f32();
    if (owner != 0) {
      ensure(acc_[op], bufs[0].shape(), DType::F32, devices_[owner]);
      acc = acc_[op].f32();
      FANOUT_CUDA_CHECK(cudaMemcpyPeerAsync(acc, dev, bufs[0].raw(), devices_[0].index, bufs[0].nbytes(), s));
    }
    for (int r = 1; r < active; ++r) {
      if (r == owner) {
        cuda_comm::add_inplace(dev, acc, bufs[r].f32(), n, s);
        continue;
      }
      FANOUT_CUDA_CHECK(cudaMemcpyPeerAsync(staging_[op].raw(), dev, bufs[r].raw(), devices_[r].index,
                                            bufs[r].nbytes(), s));
      cuda_comm::add_inplace(dev, acc, staging_[op].f32(), n, s);
    }
    if (owner != 0)
      FANOUT_CUDA_CHECK(cudaMemcpyAsync(bufs[owner].raw(), acc, bufs[owner].nbytes(), cudaMemcpyDeviceToDevice, s));
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(s));
    FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
  }

  void all_reduce(int rank, Tensor& buf, Context& ctx) override {
    // Small tensors (BatchNorm statistics, float32 or float64): summed on the
    // host in rank order, each rank into its own buffer.
    FANOUT_CHECK(buf.dtype() == DType::F32 || buf.dtype() == DType::F64) << "all_reduce of " << dtype_name(buf.dtype());
    const size_t bytes = buf.nbytes();
    {
      std::lock_guard<std::mutex> g(mu_);
      if (host_.size() < devices_.size() * bytes) host_.resize(devices_.size() * bytes * 2);
    }
    ranks_.wait();
    FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
    {
      detail::CaptureShared capture_safe;  // pageable copies
      FANOUT_CUDA_CHECK(cudaMemcpyAsync(host_.data() + rank * bytes, buf.raw(), bytes, cudaMemcpyDeviceToHost,
                                        stream_of(ctx)));
      FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
    }
    ranks_.wait();
    std::vector<char>& sum = sums_[rank];
    sum.assign(host_.begin(), host_.begin() + static_cast<std::ptrdiff_t>(bytes));
    if (buf.dtype() == DType::F64) add_host<double>(sum, bytes);
    else add_host<float>(sum, bytes);
    ranks_.wait();
    detail::CaptureShared capture_safe;
    FANOUT_CUDA_CHECK(cudaMemcpyAsync(buf.raw(), sum.data(), bytes, cudaMemcpyHostToDevice, stream_of(ctx)));
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  }

  void abort() override { ranks_.abort(); }

 private:
  // sum (rank 0's bytes) += every other active rank's, in rank order.
  template <class T>
  void add_host(std::vector<char>& sum, size_t bytes) const {
    const size_t n = bytes / sizeof(T);
    T* dst = reinterpret_cast<T*>(sum.data());
    for (int r = 1; r < ranks_.active(); ++r) {
      const T* src = reinterpret_cast<const T*>(host_.data() + r * bytes);
      for (size_t i = 0; i < n; ++i) dst[i] += src[i];
    }
  }
  // The stream the sums owned by rank r are formed on (on r's device).
  cudaStream_t owner_stream(int r) {
    std::lock_guard<std::mutex> g(mu_);
    if (!owner_streams_[r]) owner_streams_[r] = std::make_unique<Stream>(devices_[r]);
    return static_cast<cudaStream_t>(owner_streams_[r]->handle());
  }
  std::vector<Device> devices_;
  RankSlots ranks_;
  std::mutex mu_;  // host_'s size, owner_streams_
  std::vector<Tensor> staging_;
  std::vector<char> host_;                // every rank's bytes, rank after rank
  std::vector<std::vector<char>> sums_;  // one per rank: written concurrently
  std::vector<Tensor> acc_;               // [op] the running sum when the owner is not rank 0
  std::vector<std::unique_ptr<Stream>> owner_streams_;  // [rank]
  std::vector<std::vector<cudaEvent_t>> ready_;  // [op][rank]: that rank's bucket is written
};

ncclDataType_t nccl_type(const Tensor& t) {
  switch (t.dtype()) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    default: break;
  }
  FANOUT_FAIL() << "NCCL communicator: " << dtype_name(t.dtype()) << " tensors are not supported";
}

class NcclComm : public Comm {
 public:
  NcclComm(const std::vector<Device>& devices) : devices_(devices) {}
  ~NcclComm() override {
    for (auto& [k, comms] : comms_)
      for (auto c : comms) ncclCommDestroy(c);
  }
  std::string name() const override { return "nccl"; }

  void begin(int active) override {
    std::lock_guard<std::mutex> g(mu_);
    active_ = active;
    if (comms_.count(active)) return;
    std::vector<int> devs;
    for (int i = 0; i < active; ++i) devs.push_back(devices_[i].index);
    std::vector<ncclComm_t> comms(active);
    FANOUT_NCCL_CHECK(ncclCommInitAll(comms.data(), active, devs.data()));
    comms_[active] = comms;
  }

  void broadcast(int rank, Tensor& buf, Context& ctx) override {
    FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
    FANOUT_NCCL_CHECK(ncclBroadcast(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf), 0,
                                    comm(rank), stream_of(ctx)));
  }

  void reduce_add(int, int rank, const Tensor& buf, Context& ctx, int root) override {
    FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
    FANOUT_NCCL_CHECK(ncclReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf), ncclSum,
                                 root, comm(rank), stream_of(ctx)));
  }

  void all_reduce(int rank, Tensor& buf, Context& ctx) override {
    FANOUT_CUDA_CHECK(cudaSetDevice(devices_[rank].index));
    FANOUT_NCCL_CHECK(ncclAllReduce(buf.raw(), buf.raw(), static_cast<size_t>(buf.numel()), nccl_type(buf), ncclSum,
                                    comm(rank), stream_of(ctx)));
  }

  void finish(int rank, Context& ctx) override { FANOUT_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx))); }

  void abort() override {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [k, comms] : comms_)
      for (auto c : comms) ncclCommAbort(c);
    comms_.clear();
  }

 private:
  ncclComm_t comm(int rank) {
    std::lock_guard<std::mutex> g(mu_);
    FANOUT_CHECK(comms_.count(active_)) << "NCCL communicator missing for " << active_ << " ranks";
    return comms_[active_][rank];
  }
  std::vector<Device> devices_;
  std::mutex mu_;
  int active_ = 0;
  std::map<int, std::vector<ncclComm_t>> comms_;
};

}  // namespace

std::unique_ptr<Comm> make_p2p_comm(const std::vector<Device>& devices, int max_ops) {
  for (auto& d : devices) FANOUT_USER_CHECK(d.is_cuda()) << "the p2p communicator needs CUDA devices";
  // Enable direct peer access where the hardware allows; copies work either way.
  for (auto& a : devices)
    for (auto& b : devices)
      if (a.index != b.index && cuda_can_access_peer(a.index, b.index)) {
        FANOUT_CUDA_CHECK(cudaSetDevice(a.index));
        cudaError_t e = cudaDeviceEnablePeerAccess(b.index, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else FANOUT_CUDA_CHECK(e);
      }
  return std::make_unique<P2pComm>(devices, max_ops);
}

std::unique_ptr<Comm> make_nccl_comm(const std::vector<Device>& devices, int) {
  for (auto& d : devices) FANOUT_USER_CHECK(d.is_cuda()) << "the NCCL communicator needs CUDA devices";
  return std::make_unique<NcclComm>(devices);
}

}  // namespace fanout
