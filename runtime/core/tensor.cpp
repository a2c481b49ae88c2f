// Tensor shapes, views and explicit copies.
#include "runtime/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "runtime/core/error.h"
#include "runtime/core/stream.h"

namespace fanout {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
    case DType::F64: return "float64";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
  }
  return "?";
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::ChannelsLast ? "channels-last" : "contiguous";
}

void check_format(const Shape& s, MemoryFormat f) {
  FANOUT_CHECK(f == MemoryFormat::Contiguous || s.ndim == 4 || s.ndim == 5)
      << "a channels-last tensor has 4 or 5 dims, not " << s.str();
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  FANOUT_CHECK(dims.size() <= static_cast<size_t>(kMaxDims)) << "at most 5 dims, got " << dims.size();
  for (int64_t v : dims) {
    FANOUT_CHECK(v >= 0) << "negative dimension " << v;
    d[ndim++] = v;
  }
}

void Shape::index_error(int i) const {
  FANOUT_FAIL() << "dimension " << i << " is out of range for the " << ndim << "-dim shape " << str() << " (expected ["
                << -ndim << ", " << ndim - 1 << "])";
}

int64_t Shape::numel() const {
  for (int i = 0; i < ndim; ++i)
    if (d[static_cast<size_t>(i)] == 0) return 0;  // empty, however large the other dimensions
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i)
    if (__builtin_mul_overflow(n, d[static_cast<size_t>(i)], &n)) [[unlikely]]
      FANOUT_FAIL() << "shape " << str() << " has more elements than fit in 64 bits";
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << d[i];
  os << ")";
  return os.str();
}

namespace {
size_t bytes_of(const Shape& s, DType t) {
  const int64_t n = s.numel();
  FANOUT_USER_CHECK(n <= std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dtype_size(t)))
      << "a " << dtype_name(t) << " tensor of shape " << s.str() << " has more bytes than fit in 64 bits";
  return static_cast<size_t>(n) * dtype_size(t);
}
}  // namespace

Tensor Tensor::empty(const Shape& s, DType t, Device d, MemoryFormat f) {
  check_format(s, f);
  Tensor x;
  x.storage_ = allocate(d, bytes_of(s, t));
  x.shape_ = s;
  x.dtype_ = t;
  x.format_ = f;
  x.device_ = d;
  return x;
}

Tensor Tensor::empty_pinned(const Shape& s, DType t) {
  Tensor x;
  x.storage_ = allocate_pinned(bytes_of(s, t));
  x.shape_ = s;
  x.dtype_ = t;
  x.device_ = Device::cpu();
  return x;
}

Tensor Tensor::zeros(const Shape& s, DType t, Device d, MemoryFormat f) {
  Tensor x = empty(s, t, d, f);
  x.zero();
  return x;
}

Tensor Tensor::wrap(void* data, const Shape& s, DType t, Device d) {
  Tensor x;
  auto st = std::make_shared<Storage>();
  st->ptr = data;
  st->bytes = bytes_of(s, t);
  st->device = d;
  st->owned = false;
  x.storage_ = st;
  x.shape_ = s;
  x.dtype_ = t;
  x.device_ = d;
  return x;
}

void* Tensor::raw() const {
  FANOUT_CHECK(defined()) << "use of an undefined tensor";
  return static_cast<char*>(storage_->ptr) + offset_;
}

float* Tensor::f32() const {
  FANOUT_CHECK(dtype_ == DType::F32) << "expected float32 tensor, got " << dtype_name(dtype_);
  return data<float>();
}

double* Tensor::f64() const {
  FANOUT_CHECK(dtype_ == DType::F64) << "expected float64 tensor, got " << dtype_name(dtype_);
  return data<double>();
}

Tensor Tensor::view(const Shape& s) const {
  FANOUT_CHECK(s.numel() == numel()) << "view " << s.str() << " of tensor " << shape_.str();
  FANOUT_CHECK(!channels_last() || s == shape_)
      << "view " << s.str() << " of a channels-last tensor " << shape_.str() << " (convert it first)";
  Tensor v = *this;
  v.shape_ = s;
  return v;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  FANOUT_CHECK(dim() >= 1 && 0 <= begin && begin <= end && end <= size(0))
      << "slice [" << begin << ", " << end << ") of " << shape_.str();
  Tensor v = *this;
  const int64_t row = size(0) == 0 ? 0 : numel() / size(0);
  v.offset_ += static_cast<size_t>(begin * row) * dtype_size(dtype_);
  v.shape_[0] = end - begin;
  return v;
}

Tensor Tensor::seen_from(Device d) const {
  FANOUT_CHECK(device_.same_memory(d)) << "a tensor on " << device_.str() << " seen from " << d.str();
  Tensor v = *this;
  v.device_ = d;
  return v;
}

Tensor Tensor::flat(int64_t offset, const Shape& s) const {
  FANOUT_CHECK(offset >= 0 && offset + s.numel() <= numel())
      << "flat view [" << offset << ", +" << s.numel() << ") of " << numel() << " elements";
  FANOUT_CHECK(!channels_last()) << "flat view of a channels-last tensor " << shape_.str();
  Tensor v = *this;
  v.offset_ += static_cast<size_t>(offset) * dtype_size(dtype_);
  v.shape_ = s;
  return v;
}

Tensor Tensor::as(const Shape& s, DType t, MemoryFormat f) const {
  check_format(s, f);
  FANOUT_CHECK(static_cast<size_t>(s.numel()) * dtype_size(t) <= nbytes())
      << "a view of " << s.str() << " " << dtype_name(t) << " in " << nbytes() << " bytes";
  Tensor v = *this;
  v.shape_ = s;
  v.dtype_ = t;
  v.format_ = f;
  return v;
}

Tensor Tensor::to(Device d, Stream* s) const {
  Tensor out = empty(shape_, dtype_, d, format_);
  out.copy_from(*this, s);
  return out;
}

void Tensor::copy_from(const Tensor& src, Stream* s) {
  FANOUT_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_ && src.format_ == format_)
      << "copy " << src.shape_.str() << " " << dtype_name(src.dtype_) << " " << memory_format_name(src.format_)
      << " into " << shape_.str() << " " << dtype_name(dtype_) << " " << memory_format_name(format_);
  if (nbytes() == 0) return;
  if (device_.is_cpu() && src.device_.is_cpu()) {
    if (raw() != src.raw()) std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  backend::copy_bytes(raw(), device_, src.raw(), src.device_, nbytes(), s ? s->handle() : nullptr);
}

void Tensor::fill(float v, Stream* s) {
  FANOUT_CHECK(dtype_ == DType::F32) << "fill needs float32";
  if (device_.is_cpu()) {
    std::fill(f32(), f32() + numel(), v);
    return;
  }
  backend::fill_f32_cuda(device_.index, f32(), static_cast<size_t>(numel()), v, s ? s->handle() : nullptr);
}

void Tensor::zero(Stream* s) {
  if (device_.is_cpu()) {
    if (nbytes()) std::memset(raw(), 0, nbytes());
    return;
  }
  FANOUT_CHECK(nbytes() % 4 == 0) << "zero on CUDA needs whole 4-byte words, not " << nbytes() << " bytes";
  backend::fill_f32_cuda(device_.index, static_cast<float*>(raw()), nbytes() / 4, 0.0f, s ? s->handle() : nullptr);
}

void ensure(Tensor& t, const Shape& s, DType dt, Device d, MemoryFormat f) {
  check_format(s, f);
  if (t.defined() && t.shape() == s && t.dtype() == dt && t.device() == d && t.format() == f) return;
  // Reuse a large-enough buffer (e.g. for a smaller last batch) so alternating
  // batch sizes allocate nothing once the largest has been seen.
  const size_t need = static_cast<size_t>(s.numel()) * dtype_size(dt);
  if (t.defined() && t.dtype() == dt && t.device() == d && t.offset_ == 0 && t.storage_->owned &&
      t.storage_->bytes >= need) {
    t.shape_ = s;
    t.format_ = f;
    return;
  }
  t = Tensor::empty(s, dt, d, f);
}

}  // namespace fanout
