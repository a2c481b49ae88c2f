// Kernel tests written once and run on every backend (Caffe's typed tests
// over CPU and GPU). A suite derives from BackendTest, writes TEST_P bodies
// against an independent reference (naive loops, float64), and instantiates
// itself with FANOUT_ON_EVERY_BACKEND(Suite): instances `cpu` and `cuda`.
// The cuda instance skips without a visible GPU (fails under
// FANOUT_REQUIRE_GPU=1, as the GPU script sets it). Bodies make inputs on the
// host, hand them to the backend with up(), read results with down(), and
// pick tolerances with tol(cpu, cuda): the CUDA ones are those the former
// CUDA-vs-CPU suite used. Keep what up() returns in a named tensor until
// down() has run: ops are asynchronous on CUDA.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "runtime/core/context.h"
#include "runtime/core/device.h"
#include "runtime/core/tensor.h"
#include "support/test_util.h"

namespace fanout::testing {

class BackendTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) FANOUT_SKIP_WITHOUT_GPU();
    ctx_ = std::make_unique<Context>(GetParam());
  }

  Device dev() const { return GetParam(); }
  bool on_cuda() const { return GetParam().is_cuda(); }
  Context& ctx() { return *ctx_; }
  double tol(double cpu, double cuda) const { return on_cuda() ? cuda : cpu; }

  // A host tensor on the backend: a copy on CUDA, a copy on CPU too (bodies
  // may write either without touching the other).
  Tensor up(const Tensor& host) const { return on_cuda() ? host.to(dev()) : clone(host); }
  // Results on the host, after the backend's compute stream has finished.
  Tensor down(const Tensor& t) {
    if (!on_cuda()) return clone(t);
    ctx_->compute().synchronize();
    return t.to(Device::cpu());
  }
  // An output on the backend full of NaN (float) or -7 (int32): what an op
  // fails to write stays visibly wrong.
  Tensor poisoned(const Shape& s, DType dt = DType::F32) const {
    return up(cudatest::poisoned_host(s, dt));
  }

  // A float32 host result against a float64 reference: on CPU every element
  // within cpu_tol * max(1, max |want|); on CUDA within cuda_rtol as
  // cudatest::close measures it, or as on the CPU (with cuda_rtol) where the
  // reference is zero up to rounding. NaN fails either way.
  ::testing::AssertionResult matches(const Tensor& got, const std::vector<double>& want, double cpu_tol,
                                     double cuda_rtol) const {
    if (got.numel() != static_cast<int64_t>(want.size()))
      return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.size();
    double scale = 1, peak = 0;
    for (double v : want) peak = std::max(peak, std::abs(v));
    scale = std::max(scale, peak);
    // A reference that is zero up to rounding (e.g. LayerNorm's dx over one
    // element) has no relative scale: on CUDA too, compare against `scale`.
    if (on_cuda() && peak > cuda_rtol * scale) {
      Tensor w = Tensor::empty(got.shape());
      for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = static_cast<float>(want[static_cast<size_t>(i)]);
      return cudatest::close(got, w, cuda_rtol);
    }
    const double tol = on_cuda() ? cuda_rtol : cpu_tol;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::abs(double(got.f32()[i]) - want[i]);
      if (!(d <= tol * scale))
        return ::testing::AssertionFailure() << "element " << i << ": " << got.f32()[i] << " vs " << want[i]
                                             << " (tolerance " << tol * scale << ")";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::unique_ptr<Context> ctx_;
};

inline std::string backend_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cuda() ? "cuda" : "cpu";
}

}  // namespace fanout::testing

#define FANOUT_ON_EVERY_BACKEND(Suite)                                                                   \
  INSTANTIATE_TEST_SUITE_P(, Suite, ::testing::Values(::fanout::Device::cpu(), ::fanout::Device::cuda(0)), \
                           ::fanout::testing::backend_name)

// A suite of no state of its own on every backend: its fixture and instances.
#define FANOUT_BACKEND_SUITE(Suite)                         \
  class Suite : public ::fanout::testing::BackendTest {}; \
  FANOUT_ON_EVERY_BACKEND(Suite)
