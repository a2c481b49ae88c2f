// DataLoader: batches of normalized (optionally augmented) samples in a
// sampler's order, built ahead by persistent worker threads into a fixed ring
// of reused (optionally page-locked) buffers. A batch's content depends only on
// the sampler's order, the seed, the epoch and the sample indices: never on
// the number of workers, the prefetch depth or thread timing. One thread
// consumes (start_epoch, next); the workers are internal.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/tensor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/sampler.h"
#include "runtime/data/transforms.h"

namespace fanout::data {

// Batches in flight per worker, at most (more buys nothing but memory).
inline constexpr int kMaxPrefetch = 64;
// Loader threads, at most (past that it is a typo).
inline constexpr int kMaxWorkers = 256;

struct LoaderOptions {
  int64_t batch_size = 32;
  int workers = 0;          // 0: batches are built on the calling thread inside next()
  int prefetch = 2;         // batches in flight per worker (PyTorch's prefetch_factor); >= 1
  bool drop_last = false;
  bool pin_memory = false;  // batch buffers in page-locked memory (allocate_pinned), so H2D copies are async;
                            // plain memory when no CUDA device is visible (as PyTorch)
  Augment augment;
  uint64_t seed = 0;        // feeds the augmentation
  std::string batch_name = "batch";  // batch_size in messages ("evaluation batch (--eval-batch-size)")
};

class DataLoader {
 public:
  // Validates options with one-line FANOUT_USER_CHECK errors (batch_size > 0, workers >= 0, prefetch >= 1).
  // ds must outlive the loader.
  DataLoader(const Dataset& ds, std::unique_ptr<Sampler> sampler, const LoaderOptions& o);
  ~DataLoader();  // stops and joins the workers; never hangs, even mid-epoch
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // sampler->set_epoch(epoch); workers start filling; abandons an unfinished epoch cleanly.
  // first_batch > 0 skips the epoch's first batches (a run resumed mid-epoch):
  // the next batch is the one an uninterrupted epoch gives at that position.
  // first_sample > 0 starts the epoch's batches at that sample of the
  // sampler's order instead of its start (a run resumed mid-epoch with another
  // batch size: the rest of the epoch, re-batched); first_batch then counts
  // batches from there.
  void start_epoch(int64_t epoch, int64_t first_batch = 0, int64_t first_sample = 0);
  int64_t num_batches() const;  // for the current sampler size, from the epoch's first sample
  int64_t num_samples() const;  // samples delivered per epoch (drop_last aware), likewise
  // Next batch in order: x (B, sample shape...) f32 and y, (B) i32 class indices or (B, target shape...)
  // f32 dense targets (Dataset::target_shape), on the CPU, views of a reused slot buffer;
  // valid until the next call to next() or start_epoch(). Returns false at the end of the epoch.
  // An exception thrown while building a batch (in a worker or inline) is rethrown here, in the
  // batch's turn; that batch is skipped and the following next() goes on with the one after it.
  bool next(Tensor& x, Tensor& y);
  // Seconds next() spent blocked waiting for a batch since start_epoch (with workers == 0: building it).
  double wait_seconds() const;
  const LoaderOptions& options() const { return opts_; }
  bool pinned() const { return pinned_; }  // whether the batch buffers are page-locked

 private:
  enum class SlotState { Free, Filling, Ready, Failed, Handed };
  struct Slot {
    Tensor x, y;  // a batch of samples and of targets, allocated once
    SlotState state = SlotState::Free;
    int64_t batch = -1;
    std::exception_ptr error;
  };

  void allocate_slots(int64_t rows);
  int64_t batch_rows(int64_t b) const;
  // Fills slot s with batch b; returns false when abandoned (the generation moved on).
  bool build(int64_t b, Slot& s, uint64_t generation);
  void worker_loop();
  void stop_workers();

  const Dataset& ds_;
  std::unique_ptr<Sampler> sampler_;
  LoaderOptions opts_;
  bool pinned_ = false;
  int64_t sample_numel_ = 0;  // elements of one sample
  int64_t target_numel_ = 0;  // of one dense target (0: class labels)
  int64_t slot_rows_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;

  // Guarded by mu_ (the epoch's order and epoch are written only while no worker builds).
  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // workers: a batch can be claimed, or stop
  std::condition_variable ready_cv_;  // consumer: a slot became ready; start_epoch: a worker went idle
  std::atomic<uint64_t> generation_{0};  // bumped to abandon an epoch; builders poll it between samples
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t num_batches_ = 0;
  int64_t first_sample_ = 0;  // the epoch's batches start at this sample of order_
  int64_t next_claim_ = 0, next_consume_ = 0;
  int64_t handed_ = -1;  // slot handed to the consumer by the last next(), released by the following one
  int busy_ = 0;         // workers building a batch
  bool active_ = false, started_ = false, stop_ = false;
  double wait_seconds_ = 0;
};

}  // namespace fanout::data
