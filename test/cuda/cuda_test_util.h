// Helpers of the CUDA-vs-CPU op tests: device copies, poisoning, and a
// comparison relative to the reference tensor's scale. Every test starts with
// FANOUT_SKIP_WITHOUT_GPU(): it skips without a visible GPU, unless
// FANOUT_REQUIRE_GPU=1 (the GPU script sets it), where it fails instead, so a
// broken CUDA install cannot pass as a machine without a GPU.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include "runtime/core/context.h"
#include "runtime/core/device.h"
#include "runtime/core/tensor.h"
#include "support/test_util.h"

namespace fanout::cudatest {

inline bool gpu_required() {
  const char* v = std::getenv("FANOUT_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

#define FANOUT_SKIP_WITHOUT_GPU()                                                               \
  do {                                                                                          \
    if (::fanout::cuda_device_count() == 0) {                                                   \
      if (::fanout::cudatest::gpu_required()) FAIL() << "FANOUT_REQUIRE_GPU=1 but no CUDA device is visible"; \
      GTEST_SKIP() << "no CUDA device visible";                                                 \
    }                                                                                           \
  } while (0)

inline Device gpu() { return Device::cuda(0); }

// Host -> cuda:0, complete on return.
inline Tensor to_gpu(const Tensor& t) { return t.to(gpu()); }

// Waits for the context's compute stream (kernels run there; plain copies run
// on the legacy stream, which does not wait for it), then copies to the host.
// Floating values come back as float32 in the logical order (a low-type or
// channels-last output widened: testing::float32_values).
inline Tensor to_host(Context& ctx, const Tensor& t) {
  ctx.compute().synchronize();
  return testing::float32_values(t.to(Device::cpu()));
}

// A host tensor full of NaN (float, double) or of -7 (int32), and the same on
// the GPU: outputs that an op fails to write stay visibly wrong.
inline Tensor poisoned_host(const Shape& s, DType dt = DType::F32) {
  Tensor h = Tensor::empty(s, dt);
  if (dt == DType::F32) {
    std::fill(h.f32(), h.f32() + h.numel(), std::numeric_limits<float>::quiet_NaN());
  } else if (dt == DType::F64) {
    std::fill(h.f64(), h.f64() + h.numel(), std::numeric_limits<double>::quiet_NaN());
  } else if (dt == DType::I32) {
    std::fill(h.data<int32_t>(), h.data<int32_t>() + h.numel(), -7);
  }
  return h;
}
inline Tensor poisoned_gpu(const Shape& s, DType dt = DType::F32) { return to_gpu(poisoned_host(s, dt)); }
inline Tensor poisoned_cpu(const Shape& s, DType dt = DType::F32) { return poisoned_host(s, dt); }

inline double max_abs(const Tensor& t_any) {
  const Tensor t = testing::float32_values(t_any);
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(double(t.f32()[i])));
  return m;
}

// Every element of `got` (host, float) within rtol of `want`, measured against
// max(|want_i|, rms(want)): relative for large entries, and relative to the
// tensor's typical size for entries near zero (where cancellation leaves
// nothing to be relative to). NaN anywhere in `got` fails. Both tensors must
// have non-zero norms: an all-zero result proves nothing.
// Float64 tensors: max |got - want| <= rtol * max(1, max |want|), NaN failing.
inline ::testing::AssertionResult close64(const Tensor& got, const Tensor& want, double rtol) {
  if (got.numel() != want.numel() || got.dtype() != DType::F64 || want.dtype() != DType::F64)
    return ::testing::AssertionFailure() << "want two float64 tensors of one size";
  double scale = 1, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.f64()[i]));
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = std::abs(got.f64()[i] - want.f64()[i]);
    if (!(d <= rtol * scale))
      return ::testing::AssertionFailure() << "element " << i << ": " << got.f64()[i] << " vs " << want.f64()[i];
    worst = std::max(worst, d);
  }
  return ::testing::AssertionSuccess() << "worst " << worst / scale;
}

// ||got - want|| / ||want|| over elements [offset, offset + n) of two host
// arenas (float32 or float64), or ||got - want|| where want is all zeros.
inline double slice_rel(const Tensor& got_any, const Tensor& want_any, int64_t offset, int64_t n) {
  const Tensor got = testing::float32_values(got_any), want = testing::float32_values(want_any);
  auto value = [](const Tensor& t, int64_t i) { return t.dtype() == DType::F64 ? t.f64()[i] : double(t.f32()[i]); };
  double d = 0, w2 = 0;
  for (int64_t k = offset; k < offset + n; ++k) {
    const double w = value(want, k), g = value(got, k);
    d += (g - w) * (g - w);
    w2 += w * w;
  }
  return w2 > 0 ? std::sqrt(d / w2) : std::sqrt(d);
}

inline ::testing::AssertionResult close(const Tensor& got_any, const Tensor& want_any, double rtol) {
  const Tensor got = testing::float32_values(got_any), want = testing::float32_values(want_any);
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.numel();
  const double nw = testing::l2_norm(want), ng = testing::l2_norm(got);
  if (!(nw > 0)) return ::testing::AssertionFailure() << "reference is all zeros (norm " << nw << ")";
  if (!(ng > 0)) return ::testing::AssertionFailure() << "result norm is " << ng;
  const double rms = nw / std::sqrt(static_cast<double>(want.numel()));
  double worst = 0;
  int64_t worst_i = -1, bad = 0, first_bad = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.f32()[i], w = want.f32()[i];
    const double err = std::isnan(g) || std::isnan(w) ? std::numeric_limits<double>::infinity()
                                                      : std::abs(g - w) / std::max(std::abs(w), rms);
    if (err > worst || worst_i < 0) {
      worst = err;
      worst_i = i;
    }
    if (!(err <= rtol)) {
      if (first_bad < 0) first_bad = i;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.numel() << " elements off by more than " << rtol
                                       << "; worst at " << worst_i << ": got " << got.f32()[worst_i] << ", want "
                                       << want.f32()[worst_i] << " (rel " << worst << "); first at " << first_bad
                                       << ": got " << got.f32()[first_bad] << ", want " << want.f32()[first_bad]
                                       << " (rms " << rms << ")";
}

// Int32 tensors equal element for element.
inline ::testing::AssertionResult equal_i32(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.numel();
  for (int64_t i = 0; i < want.numel(); ++i)
    if (got.data<int32_t>()[i] != want.data<int32_t>()[i])
      return ::testing::AssertionFailure() << "element " << i << ": got " << got.data<int32_t>()[i] << ", want "
                                           << want.data<int32_t>()[i];
  return ::testing::AssertionSuccess();
}

}  // namespace fanout::cudatest
