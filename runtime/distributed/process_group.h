// Process group: the ranks of one distributed run (one process each) and the
// collectives DDP needs, every one bounded by a timeout. Backends: Gloo for
// host memory (TCP transport) and NCCL for CUDA memory. Ranks meet through a
// rendezvous store: `file:DIR` (Gloo's FileStore, one machine or a shared
// file system) or `redis:HOST:PORT` (Gloo's RedisStore, several machines;
// with the password in FANOUT_RDZV_PASSWORD for a server that requires one).
// Every key carries the run id, so what a dead run left in the store never
// mixes into a new one.
//
// A collective that fails (a peer died, a timeout) throws fanout::Error
// naming the operation, the rank and the cause; the group is unusable after.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/tensor.h"

namespace fanout::distributed {

struct Rendezvous {
  enum class Kind { File, Redis } kind = Kind::File;
  std::string path;  // File: the directory
  std::string host;  // Redis
  int port = 0;      // Redis
  std::string password;  // Redis: FANOUT_RDZV_PASSWORD when set; never printed
  // "file:DIR" or "redis:HOST:PORT"; anything else is a one-line error.
  static Rendezvous parse(const std::string& spec);
  std::string str() const;
};

// Checks that the rendezvous can be used before any worker starts: the
// directory exists (or is created) and is writable; the Redis server answers
// and takes the password (a missing or wrong one is a one-line error).
void probe_rendezvous(const Rendezvous& r, double timeout_s);

// --iface: checks that the interface exists here with an IPv4 address and
// names it in GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (for this process and
// the workers it starts).
void use_interface(const std::string& ifname);
// --rdzv-password-file: the file's first line becomes FANOUT_RDZV_PASSWORD;
// a missing, unreadable or empty file is a one-line error.
void read_rdzv_password(const std::string& path);

// A fault a test injects (apps/test_hooks.h): rank `rank` skips the `n`-th
// collective of tag `tag`, as a rank whose collectives fell out of step.
struct SkippedCollective {
  int rank = -1;  // -1: none
  uint32_t tag = 0, n = 0;
};

struct GroupOptions {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous;  // file:DIR or redis:HOST:PORT
  std::string run_id;      // key prefix shared by every rank of this run
  double timeout_s = 300;  // rendezvous and every collective
  SkippedCollective skip;  // tests only; Gloo honours it
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual std::string backend() const = 0;  // its name, for messages
  // Whether collectives take host tensors (Gloo), so device tensors are
  // staged through host buffers; otherwise they take device tensors (NCCL).
  virtual bool host_memory() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }

  // `what` names the operation in errors ("all-reduce of gradient bucket 3 of 7").
  // Collectives with the same `tag` must not run at the same time; ones with
  // different tags may (DDP reduces gradients on its own thread).
  // Every rank's buf becomes root's.
  virtual void broadcast(Tensor& buf, int root, const std::string& what, uint32_t tag = 0) = 0;
  // Every rank's buf becomes the elementwise sum over ranks: F32, F64, I64
  // or BF16 (each partial sum rounded to bfloat16, as NCCL sums it).
  virtual void all_reduce(Tensor& buf, const std::string& what, uint32_t tag = 0) = 0;
  // Rank root's buf becomes the elementwise sum over ranks (F32, F64 or
  // BF16); the other ranks' buf is left undefined (the algorithm's scratch).
  virtual void reduce(Tensor& buf, int root, const std::string& what, uint32_t tag = 0) = 0;
  // out (size() * in.numel(), same dtype) receives every rank's `in`, in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out, const std::string& what, uint32_t tag = 0) = 0;
  virtual void barrier(const std::string& what, uint32_t tag = 0) = 0;
  // Bytes of the buffers this rank has put into summing collectives
  // (all-reduce, reduce) so far: what its gradients cost on the wire.
  int64_t summed_bytes() const { return summed_bytes_.load(); }

 protected:
  ProcessGroup(int rank, int size, double timeout_s) : rank_(rank), size_(size), timeout_s_(timeout_s) {}
  void count_summed(const Tensor& buf) {
    if (size_ > 1) summed_bytes_ += static_cast<int64_t>(buf.nbytes());
  }
  int rank_, size_;
  double timeout_s_;
  std::atomic<int64_t> summed_bytes_{0};
};

// What every rank of a run must agree on (model size, bucket layout,
// precision, batch size...), as named integers in the same order on every
// rank. check_agreement gathers every rank's values (one all-gather of host
// memory through `gather`) and fails, on every rank, with one line naming
// the first rank and field that differ from rank 0's: "rank 1 has batch size
// 64 where rank 0 has 32 (every rank must run the same model and options)".
struct Agreed {
  std::string name;
  int64_t value = 0;
  bool real = false;   // value holds a double's bits (agreed(), shown as a number)
  bool given = false;  // value is 0 or 1: whether the option was given (given(), shown as "no NAME" or "one")
};
using Agreement = std::vector<Agreed>;
inline Agreed agreed(std::string name, double v) {
  int64_t bits;
  static_assert(sizeof bits == sizeof v);
  std::memcpy(&bits, &v, sizeof v);
  return {std::move(name), bits, true};
}
inline Agreed given(std::string name, bool v) { return {std::move(name), v, false, true}; }
void check_agreement(ProcessGroup& g, const Agreement& fields,
                     const std::function<void(const Tensor& in, Tensor& out)>& gather);

// Gloo over TCP, for tensors in host memory. The transport binds to the
// interface GLOO_SOCKET_IFNAME names when set, else to 127.0.0.1 with a file
// rendezvous (one machine) or, with Redis, to the address this machine
// reaches the server from (its route there). A collective that fails names
// the peer machines that no longer answer (by address, with their ranks).
std::unique_ptr<ProcessGroup> make_gloo_group(const GroupOptions& opts);

// NCCL over `device`, for tensors in its memory; the unique id travels
// through the same store. Non-blocking communicator, polled against the
// timeout, so a dead peer becomes an error instead of a hang. The caller's
// writes to a buffer must be complete when it calls (its stream
// synchronized); each collective runs on the group's own stream and has
// completed when the call returns.
std::unique_ptr<ProcessGroup> make_nccl_group(const GroupOptions& opts, Device device);

}  // namespace fanout::distributed
