// Host tensors in any floating storage (float32, bfloat16, float16) and
// either memory format, for the tests of kernels that read and write them:
// logical values in, logical values out, so a reference computed over the
// logical (N, C, ...) order checks every layout.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/core/half.h"
#include "runtime/core/tensor.h"

namespace fanout::testing {

// Where logical element i of shape s lies in memory in format f.
inline int64_t memory_index(const Shape& s, MemoryFormat f, int64_t i) {
  if (f == MemoryFormat::Contiguous) return i;
  const int64_t c = s[1], sp = s.numel() / (s[0] * c);
  const int64_t b = i / (c * sp), ci = (i / sp) % c, si = i % sp;
  return (b * sp + si) * c + ci;
}

// The float stored at logical element i (widened exactly).
inline float stored(const Tensor& t, int64_t i) {
  const int64_t at = memory_index(t.shape(), t.format(), i);
  switch (t.dtype()) {
    case DType::BF16: return half::float_from_bf16(t.data<uint16_t>()[at]);
    case DType::F16: return half::float_from_f16(t.data<uint16_t>()[at]);
    default: return t.f32()[at];
  }
}

// Stores v at logical element i, rounded to nearest even in the tensor's type.
inline void store(Tensor& t, int64_t i, float v) {
  const int64_t at = memory_index(t.shape(), t.format(), i);
  switch (t.dtype()) {
    case DType::BF16: t.data<uint16_t>()[at] = half::bf16_from_float(v); break;
    case DType::F16: t.data<uint16_t>()[at] = half::f16_from_float(v); break;
    default: t.f32()[at] = v;
  }
}

// A host tensor of uniform values in [lo, hi), rounded to its type.
inline Tensor random_stored(const Shape& s, DType t, MemoryFormat f, std::mt19937_64& rng, float lo = -1.0f,
                            float hi = 1.0f) {
  Tensor x = Tensor::empty(s, t, Device::cpu(), f);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) store(x, i, u(rng));
  return x;
}

// A host output of the type and format full of NaN: what an op fails to
// write stays visibly wrong.
inline Tensor poisoned_stored(const Shape& s, DType t, MemoryFormat f) {
  Tensor x = Tensor::empty(s, t, Device::cpu(), f);
  for (int64_t i = 0; i < x.numel(); ++i) store(x, i, std::nanf(""));
  return x;
}

// A float32 host tensor's values stored in type t and format f (rounded).
inline Tensor stored_copy(const Tensor& x, DType t, MemoryFormat f) {
  Tensor y = Tensor::empty(x.shape(), t, Device::cpu(), f);
  for (int64_t i = 0; i < x.numel(); ++i) store(y, i, x.f32()[i]);
  return y;
}

// The logical values of a host tensor, widened.
inline std::vector<double> stored_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = stored(t, i);
  return v;
}

// Half the spacing of the type's values at 1: the relative error of one
// rounding to it (2^-8 for bfloat16, 2^-11 for float16, 2^-24 for float32).
inline double unit_roundoff(DType t) {
  return t == DType::BF16 ? std::ldexp(1.0, -8) : t == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

// Every floating storage in every format, with a name for SCOPED_TRACE.
struct StorageCase {
  DType dtype;
  MemoryFormat format;
  std::string name() const { return std::string(dtype_name(dtype)) + " " + memory_format_name(format); }
};
inline std::vector<StorageCase> low_storage_cases() {
  std::vector<StorageCase> cases;
  for (DType t : {DType::BF16, DType::F16})
    for (MemoryFormat f : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) cases.push_back({t, f});
  cases.push_back({DType::F32, MemoryFormat::ChannelsLast});
  return cases;
}

}  // namespace fanout::testing
