// Tensor: shared storage + byte offset + shape (up to 5 dims) + dtype +
// memory format + device. The shape is always the logical one, (N, C, H, W)
// or (N, C, D, H, W); the memory format says how it lies in memory: row-major
// (contiguous) or channels-last, (N, H, W, C) or (N, D, H, W, C) in memory,
// as torch.channels_last and channels_last_3d. Copies are explicit; nothing
// here syncs host and device behind the caller's back.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "runtime/core/device.h"
#include "runtime/core/memory.h"

namespace fanout {

class Stream;

// BF16 and F16: bfloat16 and IEEE half, 2 bytes (runtime/core/half.h converts).
enum class DType : uint8_t { F32, I32, I64, U8, F64, BF16, F16 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);

// Contiguous: row-major in the logical order. ChannelsLast: dim 1 moved last
// in memory (4-D and 5-D tensors only).
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };
const char* memory_format_name(MemoryFormat f);

struct Shape {
  static constexpr int kMaxDims = 5;
  std::array<int64_t, kMaxDims> d{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  // Dimension i, counted from the end when negative (torch's size(-1)); a
  // one-line error outside [-ndim, ndim).
  int64_t operator[](int i) const { return d[static_cast<size_t>(index(i))]; }
  int64_t& operator[](int i) { return d[static_cast<size_t>(index(i))]; }
  int index(int i) const {
    if (i < -ndim || i >= ndim) [[unlikely]]
      index_error(i);
    return i < 0 ? i + ndim : i;
  }
  [[noreturn]] void index_error(int i) const;
  // The product of the dimensions; a one-line error past int64.
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "(2, 3, 4)"
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& s, DType t = DType::F32, Device d = Device::cpu(),
                      MemoryFormat f = MemoryFormat::Contiguous);
  static Tensor zeros(const Shape& s, DType t = DType::F32, Device d = Device::cpu(),
                      MemoryFormat f = MemoryFormat::Contiguous);
  // A CPU tensor in page-locked host memory (allocate_pinned), for async host-to-device copies.
  static Tensor empty_pinned(const Shape& s, DType t = DType::F32);
  // Wraps memory owned elsewhere (no copy, no ownership).
  static Tensor wrap(void* data, const Shape& s, DType t, Device d);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int dim() const { return shape_.ndim; }
  int64_t size(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemoryFormat format() const { return format_; }
  bool channels_last() const { return format_ == MemoryFormat::ChannelsLast; }
  Device device() const { return device_; }

  void* raw() const;
  template <class T> T* data() const { return static_cast<T*>(raw()); }
  float* f32() const;   // checks dtype
  double* f64() const;  // checks dtype

  // Views sharing storage. view and flat need a contiguous tensor (a
  // channels-last one may only be viewed as its own shape); slice keeps the
  // format (a batch row is one run of memory in both).
  Tensor view(const Shape& s) const;              // same numel
  Tensor slice(int64_t begin, int64_t end) const; // rows [begin, end) of dim 0
  Tensor flat(int64_t offset, const Shape& s) const;  // elements [offset, offset+numel(s))
  // This tensor's first bytes viewed as (s, t) in format f; they must hold it.
  Tensor as(const Shape& s, DType t, MemoryFormat f = MemoryFormat::Contiguous) const;
  // The same memory, owned alike, as device d sees it (a device sharing it: CPU devices).
  Tensor seen_from(Device d) const;
  bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

  // Copies into a new tensor on `d`, in the same format (stream-ordered on
  // CUDA; inline on CPU).
  Tensor to(Device d, Stream* s = nullptr) const;
  // Copies src into this (same shape, dtype and format), across devices if
  // needed; kernels::convert changes a dtype or a format.
  void copy_from(const Tensor& src, Stream* s = nullptr);
  // Host-side fill (CPU tensors) or memset-like fill on CUDA.
  void fill(float v, Stream* s = nullptr);
  void zero(Stream* s = nullptr);

 private:
  friend void ensure(Tensor& t, const Shape& s, DType dt, Device d, MemoryFormat f);
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  DType dtype_ = DType::F32;
  MemoryFormat format_ = MemoryFormat::Contiguous;
  Device device_;
};

// Throws unless a tensor of shape s can be stored in format f (channels-last:
// 4 or 5 dims).
void check_format(const Shape& s, MemoryFormat f);

// Reuses `t` when it already has the shape, dtype, format and device, or
// owns a large enough buffer of that dtype on that device; otherwise
// allocates. Layers keep their outputs this way so the steady-state step
// allocates nothing.
void ensure(Tensor& t, const Shape& s, DType dt, Device d, MemoryFormat f = MemoryFormat::Contiguous);
inline void ensure(Tensor& t, const Shape& s, Device d) { ensure(t, s, DType::F32, d); }

}  // namespace fanout
