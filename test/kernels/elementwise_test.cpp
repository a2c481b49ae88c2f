// Elementwise add / axpy / scale, aliasing, the no-backend error, and
// device/shape precondition errors shared by all kernels.
#include <gtest/gtest.h>

#include <string>

#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

TEST(Elementwise, AddAxpyScale) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(21);
  Tensor a = ft::random_tensor(Shape{3, 5, 7}, rng), b = ft::random_tensor(Shape{105}, rng);
  Tensor out = Tensor::empty(Shape{3, 5, 7});
  ft::poison(out);
  kernels::add(ctx, a, b, out);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_FLOAT_EQ(out.f32()[i], a.f32()[i] + b.f32()[i]);
  EXPECT_GT(ft::l2_norm(out), 0.0);

  Tensor y = ft::clone(a);
  kernels::axpy(ctx, -0.25f, b, y);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(y.f32()[i], a.f32()[i] - 0.25 * b.f32()[i], 1e-6);

  kernels::scale(ctx, 3.0f, y);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(y.f32()[i], 3.0 * (a.f32()[i] - 0.25 * b.f32()[i]), 1e-5);
}

TEST(Elementwise, AddMayAliasAnInput) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(22);
  Tensor a = ft::random_tensor(Shape{37}, rng), b = ft::random_tensor(Shape{37}, rng);
  Tensor a0 = ft::clone(a);
  kernels::add(ctx, a, b, a);
  for (int64_t i = 0; i < 37; ++i) EXPECT_FLOAT_EQ(a.f32()[i], a0.f32()[i] + b.f32()[i]);
  kernels::add(ctx, b, b, b);
  EXPECT_GT(ft::l2_norm(b), 0.0);
}

TEST(Elementwise, NumelMismatchThrows) {
  Context ctx(Device::cpu());
  Tensor a = Tensor::zeros(Shape{3, 5}), b = Tensor::zeros(Shape{16}), out = Tensor::zeros(Shape{15});
  EXPECT_THROW(kernels::add(ctx, a, b, out), Error);
  EXPECT_THROW(kernels::axpy(ctx, 1.0f, a, b), Error);
  Tensor i32 = Tensor::zeros(Shape{15}, DType::I32);
  EXPECT_THROW(kernels::add(ctx, a, i32, out), Error);
}

TEST(Dispatch, TensorOnAnotherDeviceThrows) {
  Context ctx(Device::cpu(0));
  // CPU devices share host memory: a cpu:1 tensor is usable from a cpu:0 context.
  Tensor a = Tensor::zeros(Shape{4}, DType::F32, Device::cpu(1));
  Tensor b = Tensor::zeros(Shape{4}, DType::F32, Device::cpu(0));
  EXPECT_NO_THROW(kernels::axpy(ctx, 1.0f, a, b));
  // A tensor claiming a CUDA device is refused before any memory is touched.
  float fake[4] = {0, 0, 0, 0};
  Tensor g = Tensor::wrap(fake, Shape{4}, DType::F32, Device::cuda(0));
  EXPECT_THROW(kernels::relu_forward(ctx, g, b), Error);
  try {
    kernels::relu_forward(ctx, g, b);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("relu_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
}

TEST(Dispatch, NoBackendNamesOpAndDevice) {
  try {
    kernels::no_backend("conv2d_forward", Device::cuda(3));
    FAIL() << "no_backend returned";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:3"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
