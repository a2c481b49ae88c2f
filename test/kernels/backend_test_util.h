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

#include <memory>
#include <string>

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
