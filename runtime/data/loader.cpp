// DataLoader: persistent workers claim batches in order into a ring of slots;
// batch b waits for slot b % slots until the consumer has released batch b - slots.
#include "runtime/data/loader.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace fanout::data {

namespace {


// The batches in flight may take at most this share of physical memory.
constexpr double kMaxInFlightShare = 0.25;

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

DataLoader::DataLoader(const Dataset& ds, std::unique_ptr<Sampler> sampler, const LoaderOptions& o)
    : ds_(ds), sampler_(std::move(sampler)), opts_(o) {
  FANOUT_USER_CHECK(o.batch_size > 0) << "batch size must be positive, got " << o.batch_size;
  FANOUT_USER_CHECK(o.workers >= 0 && o.workers <= kMaxWorkers)
      << "loader workers must be in 0.." << kMaxWorkers << ", got " << o.workers;
  FANOUT_USER_CHECK(o.prefetch >= 1 && o.prefetch <= kMaxPrefetch)
      << "loader prefetch must be in 1.." << kMaxPrefetch << " batches per worker, got " << o.prefetch;
  FANOUT_USER_CHECK(sampler_ != nullptr) << "DataLoader needs a sampler";
  ds.check(o.augment);
  pinned_ = o.pin_memory && cuda_device_count() > 0;  // page-locking needs a CUDA driver
  sample_numel_ = ds.sample_shape().numel();
  target_numel_ = ds.target_shape().numel();
  {
    const double slots = o.workers == 0 ? 1.0 : static_cast<double>(o.workers) * o.prefetch;
    const double bytes = slots * static_cast<double>(std::min(o.batch_size, std::max<int64_t>(1, sampler_->size()))) *
                         static_cast<double>((sample_numel_ + target_numel_) * 4);  // float32 or int32 each
    const double budget = kMaxInFlightShare * physical_memory_bytes();
    FANOUT_USER_CHECK(budget <= 0 || bytes <= budget)
        << "the loader's batches in flight (" << o.workers << " workers x " << o.prefetch << " prefetch x "
        << o.batch_name << " " << o.batch_size << ") would take " << bytes / 1073741824.0
        << " GiB, more than a quarter of this machine's " << physical_memory_bytes() / 1073741824.0
        << " GiB; use fewer workers, a smaller prefetch or a smaller " << o.batch_name;
  }
  slots_.resize(o.workers == 0 ? 1 : static_cast<size_t>(o.workers) * static_cast<size_t>(o.prefetch));
  allocate_slots(std::min(o.batch_size, sampler_->size()));
  try {
    for (int w = 0; w < o.workers; ++w) threads_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

DataLoader::~DataLoader() { stop_workers(); }

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    active_ = false;
    ++generation_;  // builders stop at their next sample
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

namespace {
// (rows) followed by `sample`'s dims.
Shape batch_shape(int64_t rows, const Shape& sample) {
  Shape s;
  s.ndim = sample.ndim + 1;
  s.d[0] = rows;
  for (int i = 0; i < sample.ndim; ++i) s.d[i + 1] = sample.d[i];
  return s;
}
}  // namespace

void DataLoader::allocate_slots(int64_t rows) {
  const Shape xs = batch_shape(rows, ds_.sample_shape());  // (rows, C, spatial...)
  const Shape ys = batch_shape(rows, ds_.target_shape());  // (rows) labels or (rows, K, spatial...) heatmaps
  const DType xt = ds_.input_dtype(), yt = ds_.target_dtype();
  for (Slot& slot : slots_) {
    slot.x = pinned_ ? Tensor::empty_pinned(xs, xt) : Tensor::empty(xs, xt);
    slot.y = pinned_ ? Tensor::empty_pinned(ys, yt) : Tensor::empty(ys, yt);
  }
  slot_rows_ = rows;
}

int64_t DataLoader::num_batches() const {
  const int64_t n = std::max<int64_t>(0, sampler_->size() - first_sample_), b = opts_.batch_size;
  return opts_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t DataLoader::num_samples() const {
  const int64_t n = std::max<int64_t>(0, sampler_->size() - first_sample_), b = opts_.batch_size;
  return opts_.drop_last ? n / b * b : n;
}

double DataLoader::wait_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return wait_seconds_;
}

int64_t DataLoader::batch_rows(int64_t b) const {
  return std::min(opts_.batch_size, static_cast<int64_t>(order_.size()) - first_sample_ - b * opts_.batch_size);
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch, int64_t first_sample) {
  FANOUT_USER_CHECK(first_batch >= 0) << "start_epoch: the first batch must be non-negative, got " << first_batch;
  FANOUT_USER_CHECK(first_sample >= 0 && first_sample <= sampler_->size())
      << "cannot start epoch " << epoch + 1 << " at sample " << first_sample << " of " << sampler_->size();
  sampler_->set_epoch(epoch);
  std::vector<int64_t> order = sampler_->indices();
  std::unique_lock<std::mutex> lk(mu_);
  // Abandon the previous epoch: no new claims, builders bail out, wait until none is building.
  active_ = false;
  ++generation_;
  ready_cv_.wait(lk, [&] { return busy_ == 0; });
  order_ = std::move(order);
  epoch_ = epoch;
  first_sample_ = first_sample;
  const int64_t n = static_cast<int64_t>(order_.size()) - first_sample, b = opts_.batch_size;
  num_batches_ = opts_.drop_last ? n / b : (n + b - 1) / b;
  if (std::min(b, n) > slot_rows_) allocate_slots(std::min(b, n));  // only when the sampler grew
  for (Slot& s : slots_) {
    s.state = SlotState::Free;
    s.batch = -1;
    s.error = nullptr;
  }
  next_claim_ = next_consume_ = std::min(first_batch, num_batches_);
  handed_ = -1;
  wait_seconds_ = 0;
  active_ = started_ = true;
  lk.unlock();
  work_cv_.notify_all();
}

bool DataLoader::build(int64_t b, Slot& s, uint64_t generation) {
  const int64_t rows = batch_rows(b), begin = first_sample_ + b * opts_.batch_size;
  char* xp = static_cast<char*>(s.x.raw());
  char* yp = static_cast<char*>(s.y.raw());
  const int64_t xbytes = sample_numel_ * static_cast<int64_t>(dtype_size(s.x.dtype()));
  const int64_t ybytes = target_numel_ * static_cast<int64_t>(dtype_size(s.y.dtype()));
  const SampleDraw draw{&opts_.augment, opts_.seed, epoch_};
  for (int64_t k = 0; k < rows; ++k) {
    if (generation_.load(std::memory_order_relaxed) != generation) return false;
    const int64_t i = order_[static_cast<size_t>(begin + k)];
    FANOUT_USER_CHECK(0 <= i && i < ds_.size())
        << "sample index " << i << " is out of range for dataset '" << ds_.name << "' with " << ds_.size()
        << " samples";
    ds_.get(i, draw, xp + k * xbytes, yp + k * ybytes);
  }
  return true;
}

void DataLoader::worker_loop() {
  const int64_t nslots = static_cast<int64_t>(slots_.size());
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    work_cv_.wait(lk, [&] {
      return stop_ || (active_ && next_claim_ < num_batches_ && slots_[next_claim_ % nslots].state == SlotState::Free);
    });
    if (stop_) return;
    const int64_t b = next_claim_++;
    Slot& s = slots_[b % nslots];
    s.state = SlotState::Filling;
    s.batch = b;
    const uint64_t generation = generation_.load();
    ++busy_;
    lk.unlock();
    std::exception_ptr error;
    try {
      build(b, s, generation);
    } catch (...) {
      error = std::current_exception();
    }
    lk.lock();
    --busy_;
    if (generation == generation_.load()) {  // not abandoned meanwhile: the batch is whole, or failed
      s.state = error ? SlotState::Failed : SlotState::Ready;
      s.error = error;
    }
    ready_cv_.notify_all();
  }
}

bool DataLoader::next(Tensor& x, Tensor& y) {
  std::unique_lock<std::mutex> lk(mu_);
  FANOUT_USER_CHECK(started_) << "DataLoader::next() called before start_epoch()";
  const int64_t nslots = static_cast<int64_t>(slots_.size());
  if (handed_ >= 0) {  // release the previous batch's slot
    slots_[handed_].state = SlotState::Free;
    handed_ = -1;
    if (!threads_.empty()) work_cv_.notify_all();
  }
  if (next_consume_ >= num_batches_) return false;
  const int64_t b = next_consume_++;
  Slot& s = slots_[b % nslots];
  const auto t0 = std::chrono::steady_clock::now();
  if (threads_.empty()) {
    s.state = SlotState::Filling;
    s.batch = b;
    try {
      build(b, s, generation_.load());
    } catch (...) {
      s.state = SlotState::Free;
      wait_seconds_ += seconds_since(t0);
      throw;
    }
  } else {
    ready_cv_.wait(lk, [&] { return s.batch == b && (s.state == SlotState::Ready || s.state == SlotState::Failed); });
    if (s.state == SlotState::Failed) {
      std::exception_ptr error = s.error;
      s.error = nullptr;
      s.state = SlotState::Free;
      wait_seconds_ += seconds_since(t0);
      work_cv_.notify_all();
      std::rethrow_exception(error);
    }
  }
  wait_seconds_ += seconds_since(t0);
  s.state = SlotState::Handed;
  handed_ = b % nslots;
  const int64_t rows = batch_rows(b);
  x = s.x.slice(0, rows);  // (rows, C, spatial...)
  y = s.y.slice(0, rows);  // (rows) labels or (rows, K, spatial...) heatmaps
  return true;
}

}  // namespace fanout::data
