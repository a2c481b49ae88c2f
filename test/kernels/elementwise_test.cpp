// Elementwise add / axpy / scale on every backend (sizes, misaligned views,
// aliasing), the no-backend error, and device/shape precondition errors
// shared by all kernels.
#include <gtest/gtest.h>

#include <string>

#include "kernels/activation.h"
#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

FANOUT_BACKEND_SUITE(Elementwise);

TEST_P(Elementwise, AddAxpyScale) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{105}, int64_t{1029}, int64_t{100003}}) {
    for (int64_t offset : {0, 1}) {  // offset 1: misaligned views (the scalar path of vector kernels)
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      std::mt19937_64 rng(static_cast<uint64_t>(n * 2 + offset) + 21);
      Tensor a = ft::random_tensor(Shape{n}, rng), b = ft::random_tensor(Shape{n}, rng);
      Tensor ad_full = poisoned(Shape{n + offset}), bd_full = poisoned(Shape{n + offset});
      Tensor ad = ad_full.flat(offset, Shape{n}), bd = bd_full.flat(offset, Shape{n});
      ad.copy_from(up(a));
      bd.copy_from(up(b));

      Tensor outd_full = poisoned(Shape{n + offset});
      Tensor outd = outd_full.flat(offset, Shape{n});
      kernels::add(ctx(), ad, bd, outd);
      const Tensor out = down(outd);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.f32()[i], a.f32()[i] + b.f32()[i]) << "add " << i;
      EXPECT_GT(ft::l2_norm(out), 0.0);

      // y = b - 0.25 a, then y *= 3 (fused multiply-add may round once less).
      Tensor yd_full = poisoned(Shape{n + offset});
      Tensor yd = yd_full.flat(offset, Shape{n});
      yd.copy_from(bd);
      kernels::axpy(ctx(), -0.25f, ad, yd);
      const Tensor y = down(yd);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y.f32()[i], b.f32()[i] - 0.25 * a.f32()[i], 1e-6) << "axpy " << i;
      kernels::scale(ctx(), 3.0f, yd);
      const Tensor s = down(yd);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s.f32()[i], 3.0f * y.f32()[i]) << "scale " << i;

      // add in place: out aliases a, then both inputs.
      kernels::add(ctx(), ad, bd, ad);
      const Tensor ip = down(ad);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ip.f32()[i], a.f32()[i] + b.f32()[i]) << "a += b " << i;
      kernels::add(ctx(), bd, bd, bd);
      const Tensor twice = down(bd);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(twice.f32()[i], 2.0f * b.f32()[i]) << "b += b " << i;
    }
  }
}

// add with a low type rounds what it writes: bit for bit the float32 sum
// rounded on the host, on aligned and misaligned views (the vector and the
// scalar paths of the CUDA kernel).
TEST_P(Elementwise, AddRoundsToTheLowTypeItIsGiven) {
  for (DType t : {DType::BF16, DType::F16}) {
    for (int64_t offset : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " offset " << offset);
      const int64_t n = 1029;
      std::mt19937_64 rng(static_cast<uint64_t>(offset) + 31);
      const Tensor a = ft::random_tensor(Shape{n}, rng), b = ft::random_tensor(Shape{n}, rng);
      Tensor ad_full = poisoned(Shape{n + offset}), bd_full = poisoned(Shape{n + offset});
      Tensor ad = ad_full.flat(offset, Shape{n}), bd = bd_full.flat(offset, Shape{n});
      ad.copy_from(up(a));
      bd.copy_from(up(b));
      kernels::add(ctx(), ad, bd, ad, t);  // in place, as the residual add runs
      const Tensor out = down(ad);
      int64_t moved = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float sum = a.f32()[i] + b.f32()[i];
        const float want = t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(sum))
                                            : half::float_from_f16(half::f16_from_float(sum));
        ASSERT_EQ(out.f32()[i], want) << i;
        moved += want != sum;
      }
      EXPECT_GT(moved, n / 2) << "the float32 sums must need rounding";
    }
  }
  Tensor a = up(Tensor::zeros(Shape{4}));
  EXPECT_THROW(kernels::add(ctx(), a, a, a, DType::I32), Error);
}

// On low-type storage add sums in float32 and rounds once as it stores.
TEST_P(Elementwise, AddOnLowStorageInEitherFormat) {
  const Shape s{3, 5, 4, 6};
  for (const ft::StorageCase& sc : ft::low_storage_cases()) {
    SCOPED_TRACE(sc.name());
    std::mt19937_64 rng(32);
    const Tensor a = ft::random_stored(s, sc.dtype, sc.format, rng), b = ft::random_stored(s, sc.dtype, sc.format, rng);
    Tensor ad = up(a), bd = up(b), out = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    kernels::add(ctx(), ad, bd, out);
    kernels::add(ctx(), ad, bd, ad);  // in place, as the residual add runs
    const Tensor got = down(out);
    const double u = ft::unit_roundoff(sc.dtype) * (1 + 1e-3);
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double want = double(ft::stored(a, i)) + ft::stored(b, i);
      ASSERT_NEAR(ft::stored(got, i), want, u * std::abs(want) + 1e-7) << i;
    }
    EXPECT_TRUE(ft::same_bits(down(ad), got)) << "in place";
    Tensor rounded = up(ft::poisoned_stored(s, sc.dtype, sc.format));
    const DType other = sc.dtype == DType::BF16 ? DType::F16 : DType::BF16;  // a rounding the storage cannot hold
    if (sc.dtype != DType::F32) EXPECT_THROW(kernels::add(ctx(), ad, bd, rounded, other), Error);
  }
}

TEST_P(Elementwise, NumelMismatchThrows) {
  Tensor a = up(Tensor::zeros(Shape{3, 5})), b = up(Tensor::zeros(Shape{16})), out = up(Tensor::zeros(Shape{15}));
  EXPECT_THROW(kernels::add(ctx(), a, b, out), Error);
  EXPECT_THROW(kernels::axpy(ctx(), 1.0f, a, b), Error);
  Tensor i32 = up(Tensor::zeros(Shape{15}, DType::I32));
  EXPECT_THROW(kernels::add(ctx(), a, i32, out), Error);
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
