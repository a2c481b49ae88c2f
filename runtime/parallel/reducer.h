// The gradient pipeline of DataParallel, DDP and their hybrid: buckets of
// the flat gradient arena, the bookkeeping of which are final on which
// replica, and the Reducer that takes each bucket from "final on this
// replica" to "reduced": a local stage (every replica's bucket summed onto
// the primary's through a Comm) and, with a process group, a global stage
// (the primary's bucket all-reduced across processes). Buckets go last to
// first on every replica and rank whatever order backward finishes layers
// in, as collective libraries require.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/distributed/process_group.h"
#include "runtime/nn/module.h"
#include "runtime/parallel/comm.h"
#include "runtime/parallel/process_link.h"
#include "runtime/parallel/sharding.h"
#include "runtime/parallel/slot_pool.h"

namespace fanout {

struct GradBucket {
  int64_t begin = 0, count = 0;  // arena elements (alignment padding included)
  int first_param = 0, params = 0;  // parameters [first_param, first_param + params) in arena order
};

// Contiguous arena ranges of whole parameters, about `bucket_bytes` each
// (at the arena's gradient dtype), in arena order.
class BucketLayout {
 public:
  BucketLayout(Module& model, size_t bucket_bytes);
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int size() const { return static_cast<int>(buckets_.size()); }
  int num_params() const { return static_cast<int>(offsets_.size()); }
  // Parameters whose first element lies in [begin, begin + count).
  std::pair<int, int> params_in(size_t begin, size_t count) const;
  int bucket_of(int param) const { return bucket_of_[param]; }
  const std::string& param_name(int param) const { return names_[param]; }

 private:
  std::vector<GradBucket> buckets_;
  std::vector<int64_t> offsets_;  // sorted: arena offset of each parameter
  std::vector<int> bucket_of_;
  std::vector<std::string> names_;
};

// Per replica, which parameters' gradients are final this pass; hands each
// bucket to issue(rank, bucket) once complete, last bucket first.
class BucketReadiness {
 public:
  // issue(rank, bucket) runs on the reporting rank's thread for each bucket
  // that became complete on that rank, in descending bucket order.
  BucketReadiness(const BucketLayout& layout, int ranks, std::function<void(int rank, int bucket)> issue);
  // A new backward pass on every rank: nothing is ready.
  void begin();
  // From Context::on_grad_ready: [begin, begin + count) of `rank`'s arena is final.
  void grad_ready(int rank, size_t begin, size_t count);
  // End of backward on `rank`: parameters that got no gradient (unused
  // ones) count as ready, and the remaining buckets are issued in order.
  void flush(int rank);
  // Names of the parameters `rank` has not reported this pass.
  std::vector<std::string> unready(int rank) const;
  bool complete(int rank) const { return next_[rank] < 0; }

 private:
  void issue_ready(int rank);
  const BucketLayout& layout_;
  std::function<void(int, int)> issue_;
  std::vector<std::vector<char>> param_ready_;  // [rank][param]
  std::vector<std::vector<int>> bucket_ready_;  // [rank][bucket] parameters reported
  std::vector<int> next_;                       // [rank] next bucket to issue (counts down)
};

struct ReducerOptions {
  // Across processes (DDP, hybrid): the primary's buckets are all-reduced
  // over this group. Null: this process alone.
  std::shared_ptr<distributed::ProcessGroup> group;
  // BF16: each bucket is rounded to bfloat16 before it is reduced and the
  // sum after (PyTorch DDP's bf16_compress_hook: cast, reduce, cast back).
  DType reduce_dtype = DType::F32;
  // Sharded (ZeRO): each shard's sum goes to its owner instead of
  // everywhere: locally a reduce onto the owning replica (the primary for
  // shards of other processes), across processes a reduce onto the owning
  // process. Empty: every sum to the primary (and all-reduced).
  ShardPlan shards;
};

// The reductions a layout and a shard plan make: each bucket cut at the
// shard bounds, every piece summed onto its receiver in this process.
struct ReducePiece {
  int op;     // the Comm operation id
  int owner;  // the local replica the piece's sum goes to
  int home;   // the process whose shard the piece is in (its owner's process)
  int64_t begin, count;
};
std::vector<std::vector<ReducePiece>> reduce_pieces(const BucketLayout& layout, const ShardPlan& plan);
// The arena range of the buckets that meet `range` (a shard): a ZeRO-2
// replica's gradient window, so that every bucket is either wholly in it
// (the replica's gradients written in place) or wholly outside it (in a
// pooled block while in flight). Empty (at range.first) for an empty shard.
std::pair<int64_t, int64_t> bucket_hull(const BucketLayout& layout, std::pair<int64_t, int64_t> range);

// The path from "this bucket's gradients are final on replica r" to "this
// bucket is reduced", for `replicas` (replica 0 the primary) sharing one
// layout. Local stage: replica r's bucket is reduce-added onto the
// primary's (sharded: onto each piece's owner) on r's thread as soon as it
// is complete there. Global stage (with a group): once every active
// replica's bucket has arrived, the primary's is all-reduced across
// processes (sharded: each piece reduced onto its home process, and zeroed
// where it was only sent); for gradients in host memory on the reducer's
// own thread while backward goes on, for device memory after backward
// (stream-ordered local sums), in the same order. An error of the global
// stage is rethrown by finish().
class Reducer {
 public:
  Reducer(std::vector<Module*> replicas, std::vector<Context*> contexts, Comm& comm, const BucketLayout& layout,
          const ReducerOptions& o);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before a pass: `active` replicas take part; `training`: gradients will
  // come; `sync`: the global stage runs (DDP's no_sync is sync = false).
  void begin(int active, bool training, bool sync);
  // From replica `rank`'s Context::on_grad_ready.
  void grad_ready(int rank, size_t begin, size_t count);
  // End of replica `rank`'s backward: unreported parameters count as ready.
  void flush(int rank) { ready_.flush(rank); }
  std::vector<std::string> unready(int rank) const { return ready_.unready(rank); }
  // After every replica's backward: the buckets are reduced when it returns
  // (a shard whose replica sat out a small batch gets its sum from the primary here).
  void finish();
  // A replica failed: the buckets it did not finish will not come.
  void abort();
  // The process group, or null.
  ProcessLink* link() { return link_.get(); }
  // ZeRO-2 (a plan of ShardMode::Grads; host memory): from replica
  // `rank`'s Context::on_grad_write, before layers write the range.
  void grad_write(int rank, size_t begin, size_t count);
  // Bytes replica `rank` holds for gradients in flight (ZeRO-2), else 0.
  int64_t in_flight_bytes(int rank) const { return in_flight_ ? flight_[rank].pool->bytes() : 0; }

 private:
  void local(int rank, int bucket);
  void round_piece(int rank, const ReducePiece& p);
  // Where a piece's sum goes this pass: its owner, or the primary when the owner sits out.
  int root(const ReducePiece& p) const { return p.owner < active_ ? p.owner : 0; }
  void global(int bucket);
  // Sharded: the sums of pieces whose owner sat out this pass (they went to the primary) into the owner's range.
  void pass_on_sat_out();
  // mine += sum (float64 sums on the host; a sum on another GPU through a copy on mine's).
  void add_into(Context& ctx, const Tensor& sum, Tensor& mine);
  void global_loop();
  Tensor bucket_of(int rank, int bucket);
  void round(int rank, Tensor& t);

  std::vector<Module*> replicas_;
  std::vector<Context*> contexts_;
  Comm& comm_;
  const BucketLayout& layout_;
  ReducerOptions opts_;
  std::vector<std::vector<ReducePiece>> pieces_;  // [bucket]
  std::vector<std::string> global_names_;         // [bucket] the global stage's operation names, for errors
  Tensor sat_out_;                                // a sum on its way to another GPU's owner
  BucketReadiness ready_;
  std::unique_ptr<ProcessLink> link_;
  std::unique_ptr<std::atomic<int>[]> arrivals_;  // [bucket] replicas past reduce_add this pass
  bool host_memory_;  // CPU replicas: a reduce_add is complete when it returns
  int active_ = 0;
  bool training_ = false, sync_ = false;
  bool deferred_ = false;  // the global stage waits for finish() this pass (an owner sat out)

  // Global stage on its own thread (host-memory gradients).
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> reduced_locally_;  // [bucket]
  int next_ = -1;                      // next bucket to all-reduce; -1: nothing (more) this pass
  bool stop_ = false, busy_ = false;
  std::exception_ptr error_;

  // ZeRO-2: a replica's gradient arena is the window of the buckets that
  // meet its shard (bucket_hull; Module::set_grad_window), reduced as under
  // ZeRO-1. A bucket outside it gets a block from the replica's pool on the
  // first write of the pass, its parameters' gradient views pointing there;
  // when every active replica has reduced the bucket (they wait for one
  // another), the primary sends other processes' sums on, and every block
  // goes back to its pool.
  struct InFlight {
    std::vector<char> through;  // [bucket] not wholly inside the window: gradients in a block
    std::vector<Tensor> block;  // [bucket] this pass's block, or undefined
    std::unique_ptr<SlotPool> pool;
    std::vector<Parameter*> params;  // in arena order
  };
  void open_block(int rank, int b);
  void close_block(int rank, int b);
  // Where replica `rank`'s part of piece p of bucket b lives this pass.
  Tensor piece_buffer(int rank, int b, const ReducePiece& p);
  void local_in_flight(int rank, int b);
  void global_in_flight(int b);
  bool in_flight_ = false;
  std::vector<InFlight> flight_;  // [replica]
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<char> done_;  // [bucket] reduced by every active replica this pass
  bool aborted_ = false;
};

}  // namespace fanout
