// Context: streams, handles and workspace of one device worker.
#include "runtime/core/context.h"

#include "runtime/core/error.h"

#include <algorithm>
#include <atomic>

namespace fanout {

namespace {
std::atomic<uint64_t> next_context_id{1};
}  // namespace

Context::Context(Device d, uint64_t seed) : device_(d), rng_(seed), id_(next_context_id++) {
  compute_ = std::make_unique<Stream>(d);
  copy_ = std::make_unique<Stream>(d);
  comm_ = std::make_unique<Stream>(d);
}

Context::~Context() {
  if (cublas_) backend::cublas_destroy(device_.index, cublas_);
  if (cudnn_) backend::cudnn_destroy(device_.index, cudnn_);
}

void ActivationSlots::bind(Tensor& t, const Shape& s, DType dt, Device d, MemoryFormat f) {
  if (next_ == slots_.size()) slots_.emplace_back();
  Tensor& slot = slots_[next_++];
  const size_t need = static_cast<size_t>(s.numel()) * dtype_size(dt);
  if (!slot.defined() || slot.device() != d || slot.nbytes() < need)
    slot = Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(need, 1))}, DType::U8, d);
  t = slot.as(s, dt, f);
}

size_t ActivationSlots::bytes() const {
  size_t n = grad_in_.defined() ? grad_in_.nbytes() : 0;
  for (const Tensor& t : slots_) n += t.nbytes();
  return n;
}

ActivationSlots& Context::checkpoint_slots() {
  if (!checkpoint_slots_) checkpoint_slots_ = std::make_unique<ActivationSlots>();
  return *checkpoint_slots_;
}

void ensure(Tensor& t, const Shape& s, DType dt, Context& ctx, MemoryFormat f) {
  if (ctx.slots) ctx.slots->bind(t, s, dt, ctx.device(), f);
  else ensure(t, s, dt, ctx.device(), f);
}

void* Context::workspace(size_t bytes) {
  if (!workspace_.defined() || workspace_.nbytes() < bytes) {
    // Grow geometrically so a sequence of growing requests allocates few times.
    size_t want = std::max(bytes, workspace_.defined() ? workspace_.nbytes() * 3 / 2 : size_t{0});
    want = (want + 255) / 256 * 256;
    workspace_ = Tensor::empty(Shape{static_cast<int64_t>(want)}, DType::U8, device_);
    scratch_moved();
  }
  return workspace_.raw();
}

const Tensor& Context::staging(int role, size_t bytes) {
  FANOUT_CHECK(role >= 0 && role < kStagingRoles) << "staging role " << role;
  Tensor& t = staging_[role];
  if (!t.defined() || t.nbytes() < bytes) {
    const size_t want = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    t = Tensor();  // the old buffer goes first: the peak stays at the new size
    t = Tensor::empty(Shape{static_cast<int64_t>(want)}, DType::U8, device_);
    scratch_moved();
  }
  return t;
}

size_t Context::staging_size() const {
  size_t n = 0;
  for (const Tensor& t : staging_) n += t.defined() ? t.nbytes() : 0;
  return n;
}

void* Context::cublas() {
  FANOUT_CHECK(device_.is_cuda()) << "cuBLAS handle requested on " << device_.str();
  if (!cublas_) cublas_ = backend::cublas_create(device_.index, compute_->handle());
  return cublas_;
}

void* Context::cudnn() {
  FANOUT_CHECK(device_.is_cuda()) << "cuDNN handle requested on " << device_.str();
  if (!cudnn_) cudnn_ = backend::cudnn_create(device_.index, compute_->handle());
  return cudnn_;
}

}  // namespace fanout
