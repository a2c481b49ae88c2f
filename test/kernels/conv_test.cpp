// 2-D and 3-D convolution on every backend (oneDNN on CPU, cuDNN on CUDA),
// one body for both ranks, against a direct double-precision convolution,
// forward and backward: stride 1/2, padding 0/1/2, kernels 1/3/5 and
// non-square/non-cubic ones, volumes with D != H != W, windows entirely in
// the padding, images smaller than the kernel, large volumes; math options
// (deterministic, timed algorithm search, TF32); central-difference gradient
// checks; += semantics; float64 gradients independent of the batch split;
// errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/conv.h"
#include "kernels/conv_bias.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// A convolution of either rank: a 2-D one has d = kd = 0.
struct ConvCase {
  int64_t n, c, d, h, w, oc, kd, kh, kw, stride, pad;
  int spatial() const { return d > 0 ? 3 : 2; }
  Shape x() const { return d > 0 ? Shape{n, c, d, h, w} : Shape{n, c, h, w}; }
  Shape weight() const { return d > 0 ? Shape{oc, c, kd, kh, kw} : Shape{oc, c, kh, kw}; }
  kernels::ConvGeometry geometry() const { return {stride, pad}; }
};
ConvCase conv2d(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw, int64_t stride,
                int64_t pad) {
  return {n, c, 0, h, w, oc, 0, kh, kw, stride, pad};
}
std::ostream& operator<<(std::ostream& os, const ConvCase& k) {
  return os << "N" << k.n << " x " << k.x().str() << " w " << k.weight().str() << " s" << k.stride << " p" << k.pad;
}

const std::vector<ConvCase>& cases2d() {
  static const std::vector<ConvCase> v = {
      conv2d(3, 5, 7, 9, 4, 3, 3, 1, 1),    // the usual 3x3 "same"
      conv2d(3, 5, 7, 9, 4, 3, 3, 2, 1),    // strided
      conv2d(2, 3, 7, 9, 4, 3, 3, 1, 0),    // valid
      conv2d(2, 4, 8, 7, 3, 3, 3, 2, 0),
      conv2d(2, 3, 8, 6, 5, 1, 1, 1, 0),    // 1x1 (oneDNN's 1x1 kernels)
      conv2d(2, 3, 9, 7, 4, 1, 1, 2, 0),    // 1x1 strided (downsample)
      conv2d(2, 3, 5, 6, 4, 1, 1, 1, 1),    // border outputs read only padding
      conv2d(2, 3, 7, 9, 4, 5, 5, 1, 2),    // 5x5 "same"
      conv2d(2, 3, 11, 10, 6, 5, 5, 2, 2),
      conv2d(1, 2, 5, 5, 3, 5, 5, 1, 0),    // kernel covers the image: 1x1 output
      conv2d(2, 3, 4, 5, 3, 3, 3, 1, 2),    // padding 2 with a 3x3 kernel: corner windows all padding
      conv2d(2, 3, 7, 9, 4, 3, 2, 1, 1),    // non-square kernel
      conv2d(3, 1, 9, 8, 2, 2, 3, 2, 1),    // one input channel, non-square, strided
      conv2d(2, 3, 7, 9, 4, 5, 3, 1, 1),    // OW == W but OH < H: a tall kernel
      conv2d(1, 2, 2, 3, 3, 5, 5, 1, 2),    // image smaller than the kernel: some kernel rows never valid
  };
  return v;
}

const std::vector<ConvCase>& cases3d() {
  static const std::vector<ConvCase> v = {
      {2, 3, 5, 6, 7, 4, 3, 3, 3, 1, 1},  // 3x3x3 "same"
      {2, 3, 5, 6, 7, 4, 3, 3, 3, 2, 1},  // strided
      {2, 2, 4, 7, 5, 3, 3, 3, 3, 1, 0},  // valid
      {2, 3, 5, 4, 6, 5, 1, 1, 1, 1, 0},  // 1x1x1 (oneDNN's 1x1 kernels)
      {2, 3, 5, 7, 6, 4, 1, 1, 1, 2, 0},  // 1x1x1 strided (downsample)
      {1, 2, 3, 4, 5, 3, 1, 1, 1, 1, 1},  // border outputs read only padding
      {2, 2, 5, 7, 6, 3, 5, 5, 5, 2, 2},  // 5x5x5 strided
      {1, 2, 3, 5, 4, 3, 5, 5, 5, 1, 2},  // depth smaller than the kernel
      {2, 3, 3, 4, 5, 3, 3, 3, 3, 1, 2},  // padding 2: corner windows all padding
      {1, 2, 4, 4, 4, 2, 4, 4, 4, 1, 0},  // kernel covers the volume: 1x1x1 output
      {2, 3, 4, 5, 6, 2, 2, 3, 3, 1, 1},  // non-cubic kernel
      {3, 1, 7, 6, 5, 2, 3, 2, 3, 2, 1},  // one input channel, non-cubic, strided
  };
  return v;
}
const std::vector<ConvCase>& cases(int spatial) { return spatial == 2 ? cases2d() : cases3d(); }
constexpr int kRanks[] = {2, 3};

// Large volumes: 6,348 to 40,500 output positions per image, so the CPU
// cuts their weight gradients into one call per image (kernels/cpu/conv.cpp).
const std::vector<ConvCase>& large_cases() {
  static const std::vector<ConvCase> v = {
      {1, 16, 3, 46, 46, 3, 5, 5, 5, 1, 2},
      {2, 8, 5, 90, 90, 2, 3, 3, 3, 1, 1},
      {1, 16, 7, 92, 91, 2, 5, 5, 5, 2, 2},
  };
  return v;
}

struct ConvRef {
  std::vector<double> y, dx, dw, db;
};

// Direct convolution and its gradients in double; a 2-D case is a 3-D one
// with depth 1, a kernel of depth 1 and no padding along the depth.
ConvRef naive_conv(const ConvCase& k, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* dy) {
  const int64_t d = std::max<int64_t>(k.d, 1), kd = std::max<int64_t>(k.kd, 1), pd = k.d > 0 ? k.pad : 0;
  const int64_t od = (d + 2 * pd - kd) / k.stride + 1, oh = (k.h + 2 * k.pad - k.kh) / k.stride + 1,
                ow = (k.w + 2 * k.pad - k.kw) / k.stride + 1;
  ConvRef r{std::vector<double>(k.n * k.oc * od * oh * ow), std::vector<double>(x.numel()),
            std::vector<double>(w.numel()), std::vector<double>(k.oc)};
  const float *xp = x.f32(), *wp = w.f32();
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.oc; ++o)
      for (int64_t i = 0; i < od; ++i)
        for (int64_t j = 0; j < oh; ++j)
          for (int64_t l = 0; l < ow; ++l) {
            const int64_t yi = (((n * k.oc + o) * od + i) * oh + j) * ow + l;
            const double g = dy ? dy->f32()[yi] : 0.0;
            double s = b ? b->f32()[o] : 0.0;
            r.db[o] += g;
            for (int64_t c = 0; c < k.c; ++c)
              for (int64_t a = 0; a < kd; ++a)
                for (int64_t e = 0; e < k.kh; ++e)
                  for (int64_t f = 0; f < k.kw; ++f) {
                    const int64_t id = i * k.stride - pd + a, ih = j * k.stride - k.pad + e,
                                  iw = l * k.stride - k.pad + f;
                    if (id < 0 || id >= d || ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                    const int64_t xi = (((n * k.c + c) * d + id) * k.h + ih) * k.w + iw;
                    const int64_t wi = (((o * k.c + c) * kd + a) * k.kh + e) * k.kw + f;
                    s += double(xp[xi]) * wp[wi];
                    r.dx[xi] += g * wp[wi];
                    r.dw[wi] += g * xp[xi];
                  }
            r.y[yi] = s;
          }
  return r;
}

TEST(Conv, OutputShape) {
  using kernels::conv_output_shape;
  EXPECT_EQ(conv_output_shape(2, Shape{3, 5, 7, 9}, Shape{4, 5, 3, 3}, {1, 1}), (Shape{3, 4, 7, 9}));
  EXPECT_EQ(conv_output_shape(2, Shape{3, 5, 7, 9}, Shape{4, 5, 3, 3}, {2, 1}), (Shape{3, 4, 4, 5}));
  EXPECT_EQ(conv_output_shape(2, Shape{1, 1, 28, 28}, Shape{6, 1, 5, 5}, {1, 0}), (Shape{1, 6, 24, 24}));
  EXPECT_EQ(conv_output_shape(3, Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {1, 1}), (Shape{2, 4, 5, 6, 7}));
  EXPECT_EQ(conv_output_shape(3, Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {2, 1}), (Shape{2, 4, 3, 3, 4}));
  EXPECT_EQ(conv_output_shape(3, Shape{1, 1, 16, 32, 24}, Shape{8, 1, 5, 5, 5}, {1, 0}), (Shape{1, 8, 12, 28, 20}));
  EXPECT_EQ(conv_output_shape(3, Shape{1, 2, 3, 5, 4}, Shape{3, 2, 5, 5, 5}, {1, 2}), (Shape{1, 3, 3, 5, 4}));
  for (int s : kRanks) {
    SCOPED_TRACE(s);
    const ConvCase k = cases(s)[0];
    Shape other_channels = k.weight(), tall = k.x();
    other_channels[1] += 1;
    tall[2] = 2;
    Shape big_kernel = k.weight();
    for (int a = 2; a < big_kernel.ndim; ++a) big_kernel[a] = 5;
    EXPECT_THROW(conv_output_shape(s, k.x(), other_channels, {1, 1}), Error);     // channels
    EXPECT_THROW(conv_output_shape(s, tall, big_kernel, {1, 1}), Error);          // kernel too big
    EXPECT_THROW(conv_output_shape(s, k.x(), k.weight(), {0, 1}), Error);         // stride 0
    EXPECT_THROW(conv_output_shape(s, k.x(), k.weight(), {1, -1}), Error);        // padding < 0
    EXPECT_THROW(conv_output_shape(5 - s, k.x(), k.weight(), {1, 1}), Error);     // the other rank
  }
  EXPECT_THROW(conv_output_shape(1, Shape{3, 5, 7}, Shape{4, 5, 3}, {1, 1}), Error);
}

class ConvOnBackend : public ft::BackendTest {
 protected:
  // Forward and backward against the direct convolution: within 1e-4
  // (relative to the largest reference value) on CPU, within `cuda_rtol` on
  // CUDA. y and dx are poisoned (=); dw and db start from random values (+=);
  // a second backward without dx (cached plan on CUDA) accumulates again.
  void check(const ConvCase& k, bool with_bias, const MathOptions& math, double cuda_rtol, std::mt19937_64& rng) {
    SCOPED_TRACE(::testing::Message() << k << " bias " << with_bias << " deterministic " << math.deterministic
                                      << " benchmark " << math.cudnn_benchmark << " tf32 " << math.allow_tf32);
    ctx().math = math;
    const int s = k.spatial();
    Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry());
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dw0 = ft::random_tensor(w.shape(), rng), db0 = ft::random_tensor(Shape{k.oc}, rng);
    Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(dw0), dbd = up(db0);
    Tensor yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::conv_forward(ctx(), s, xd, wd, with_bias ? &bd : nullptr, k.geometry(), yd);
    kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), &dxd, dwd, &dbd);
    ConvRef r = naive_conv(k, x, w, with_bias ? &b : nullptr, &dy);
    const ConvRef fresh = r;
    for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += dw0.f32()[i];
    for (int64_t i = 0; i < k.oc; ++i) r.db[i] += db0.f32()[i];
    const Tensor y = down(yd), dx = down(dxd);
    EXPECT_TRUE(matches(y, r.y, 1e-4, cuda_rtol)) << "y";
    EXPECT_TRUE(matches(dx, r.dx, 1e-4, cuda_rtol)) << "dx";
    EXPECT_TRUE(matches(down(dwd), r.dw, 1e-4, cuda_rtol)) << "dw (+=)";
    EXPECT_TRUE(matches(down(dbd), r.db, 1e-4, cuda_rtol)) << "db (+=)";
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);

    kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), nullptr, dwd, &dbd);
    for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += fresh.dw[i];
    for (int64_t i = 0; i < k.oc; ++i) r.db[i] += fresh.db[i];
    EXPECT_TRUE(matches(down(dwd), r.dw, 1e-4, cuda_rtol)) << "dw after a second backward without dx";
    EXPECT_TRUE(matches(down(dbd), r.db, 1e-4, cuda_rtol)) << "db after a second backward";
  }
};
FANOUT_ON_EVERY_BACKEND(ConvOnBackend);

TEST_P(ConvOnBackend, ForwardBackwardAgainstDirectConvolution) {
  std::mt19937_64 rng(51);
  int variant = 0;
  for (int s : kRanks)
    for (const ConvCase& k : cases(s)) check(k, (variant++ % 2) == 0, {}, 1e-4, rng);
}

TEST_P(ConvOnBackend, SquareKernelGridAgainstDirectConvolution) {
  std::mt19937_64 rng(100);
  for (int64_t k : {1, 3, 5})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1, 2}) {
        check(conv2d(3, 5, 7, 9, 4, k, k, stride, pad), true, {}, 1e-4, rng);
        check(conv2d(2, 3, 9, 7, 6, k, k, stride, pad), false, {}, 1e-4, rng);
        check({2, 3, 5, 7, 6, 4, k, k, k, stride, pad}, stride == 1, {}, 1e-4, rng);
      }
}

TEST_P(ConvOnBackend, LargeVolumesAgainstDirectConvolution) {
  std::mt19937_64 rng(303);
  int variant = 0;
  for (const ConvCase& k : large_cases()) check(k, (variant++ % 2) == 0, {}, 1e-3, rng);
}

// 3-D weight gradients the CPU may run as 2-D calls over depth slices
// (kernels/cpu/conv.cpp), forced on and off so that both paths run on any
// CPU: one input or output channel (whose channels-last copy is the tensor
// itself), a volume shallower than the kernel, a padding as deep as the
// kernel, depths cut into several calls (32x32 outputs: 4 slices a call),
// stride 2 with several calls, a plane of more than 4,096 outputs (one
// slice a call).
TEST_P(ConvOnBackend, ThreeDWeightGradientsOverDepthSlices) {
  const ConvCase cases[] = {
      {2, 1, 6, 7, 5, 3, 3, 3, 3, 1, 1},   {3, 4, 5, 6, 7, 1, 3, 3, 3, 1, 1},    {1, 1, 4, 6, 5, 2, 5, 5, 5, 1, 2},
      {2, 3, 2, 5, 6, 4, 5, 5, 5, 1, 2},   {3, 8, 10, 32, 32, 4, 3, 3, 3, 1, 1}, {2, 5, 9, 8, 7, 3, 3, 3, 3, 2, 1},
      {2, 6, 7, 9, 8, 5, 3, 3, 3, 1, 0},   {2, 3, 3, 5, 4, 2, 1, 1, 1, 1, 1},    {1, 4, 12, 64, 64, 2, 3, 3, 3, 2, 1},
      {1, 2, 3, 66, 65, 2, 3, 3, 3, 1, 1},
  };
  for (const char* setting : {"always", "never", "auto"}) {
    SCOPED_TRACE(setting);
    ASSERT_EQ(setenv("FANOUT_CONV3D_WEIGHT_SLICES", setting, 1), 0);
    std::mt19937_64 rng(404);
    int variant = 0;
    for (const ConvCase& k : cases) check(k, (variant++ % 2) == 0, {}, 1e-4, rng);
  }
  unsetenv("FANOUT_CONV3D_WEIGHT_SLICES");
}

TEST_P(ConvOnBackend, MathOptionsAgainstDirectConvolution) {
  std::mt19937_64 rng(200);
  MathOptions det;
  det.deterministic = true;
  MathOptions bench;
  bench.cudnn_benchmark = true;
  MathOptions bench_det = bench;
  bench_det.deterministic = true;
  for (int64_t k : {1, 3, 5}) {
    check(conv2d(3, 5, 7, 9, 4, k, k, 2, 1), true, det, 1e-4, rng);
    check(conv2d(3, 5, 7, 9, 4, k, k, 1, 2), true, bench, 1e-4, rng);
    if (k == 5) continue;
    check({2, 3, 5, 6, 7, 4, k, k, k, 2, 1}, true, det, 1e-4, rng);
    check({2, 3, 5, 6, 7, 4, k, k, k, 1, 1}, true, bench, 1e-4, rng);
  }
  check(conv2d(4, 16, 12, 12, 32, 3, 3, 1, 1), false, det, 1e-3, rng);
  check(conv2d(3, 5, 7, 9, 4, 3, 3, 2, 0), true, bench_det, 1e-4, rng);
  check({2, 3, 5, 6, 7, 4, 3, 3, 3, 2, 0}, false, bench_det, 1e-4, rng);
  // K = 64 * 3 * 3 = 576 per output, and N * OH * OW = 1152 per weight gradient; K = 16 * 27 = 432.
  check(conv2d(8, 64, 13, 11, 96, 3, 3, 1, 1), true, {}, 1e-3, rng);
  check(conv2d(8, 64, 13, 11, 96, 3, 3, 2, 1), false, {}, 1e-3, rng);
  check({2, 16, 6, 9, 8, 24, 3, 3, 3, 1, 1}, true, {}, 1e-3, rng);
}

// Under autocast the layers hand the kernels low-type values; where the
// kernels round in the low type (kernels::conv_rounds_in_low_type: CUDA's
// cuDNN, a CPU's oneDNN in bfloat16 where it multiplies it natively) they
// round y, dx and the dw term to it, otherwise the CPU keeps float32.
// Against the direct convolution of the rounded operands: rounding kernels
// each element within 4 u (u = 2^-9 bfloat16, 2^-11 float16: one bfloat16
// ulp at worst, two float16 ones) of max(|reference|, its rms), float32
// ones 1e-4. Rounding the exact result costs half an ulp; cuDNN's bf16
// kernels on an H100 missed by up to 0.99 ulp (21 of 9,600 outputs past
// 2 u): their float32 accumulation is not exact either.
TEST_P(ConvOnBackend, LowPrecisionAgainstRoundedOperands) {
  std::mt19937_64 rng(77);
  for (DType t : {DType::BF16, DType::F16}) {
    const double u = std::ldexp(1.0, t == DType::BF16 ? -9 : -11);
    auto low = [&](Tensor v) {
      for (int64_t i = 0; i < v.numel(); ++i)
        v.f32()[i] = t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(v.f32()[i]))
                                      : half::float_from_f16(half::f16_from_float(v.f32()[i]));
      return v;
    };
    MathOptions m;
    m.autocast = t;
    ctx().math = m;
    const bool rounds = kernels::conv_rounds_in_low_type(ctx());
    EXPECT_TRUE(rounds || !on_cuda());
    // Each element within 4 u of max(|reference|, rms) where the kernels
    // round (cudatest::close, on any backend), else as matches() says.
    auto near = [&](const Tensor& got, const std::vector<double>& want, double cpu_tol) {
      if (!rounds || on_cuda()) return matches(got, want, cpu_tol, 4 * u);
      Tensor w = Tensor::empty(got.shape());
      for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = static_cast<float>(want[static_cast<size_t>(i)]);
      return cudatest::close(got, w, 4 * u);
    };
    for (const ConvCase& k : {conv2d(4, 16, 10, 10, 24, 3, 3, 1, 1), conv2d(3, 8, 9, 7, 12, 3, 3, 2, 1),
                              ConvCase{2, 8, 5, 6, 7, 12, 3, 3, 3, 1, 1}}) {
      SCOPED_TRACE(::testing::Message() << k << " " << dtype_name(t));
      const int s = k.spatial();
      const Tensor x = low(ft::random_tensor(k.x(), rng)), w = low(ft::random_tensor(k.weight(), rng));
      const Tensor b = low(ft::random_tensor(Shape{k.oc}, rng));
      const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry());
      const Tensor dy = low(ft::random_tensor(ys, rng)), dw0 = ft::random_tensor(w.shape(), rng);
      Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(dw0), dbd = up(Tensor::zeros(Shape{k.oc}));
      Tensor yd = poisoned(ys), dxd = poisoned(x.shape());
      kernels::conv_forward(ctx(), s, xd, wd, &bd, k.geometry(), yd);
      kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), &dxd, dwd, &dbd);
      ConvRef r = naive_conv(k, x, w, &b, &dy);
      for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += dw0.f32()[i];
      EXPECT_TRUE(near(down(yd), r.y, 1e-4)) << "y";
      EXPECT_TRUE(near(down(dxd), r.dx, 1e-4)) << "dx";
      EXPECT_TRUE(near(down(dwd), r.dw, 1e-4)) << "dw (+=)";
      EXPECT_TRUE(matches(down(dbd), r.db, 1e-4, 1e-4)) << "db (float32 on both)";
    }
  }
}

// Where the kernels round in the low type they take float32 operands of any
// values and round them as they read them: y and dx, stored float32, hold
// low-type values, each within 4 u of the direct convolution of the rounded
// operands (as above), and dw's float32 values move by a term that is one.
TEST_P(ConvOnBackend, RoundsFloat32OperandsInTheLowType) {
  std::mt19937_64 rng(79);
  int checked = 0, in_float32 = 0;
  for (DType t : {DType::BF16, DType::F16}) {
    MathOptions m;
    m.autocast = t;
    ctx().math = m;
    if (!kernels::conv_rounds_in_low_type(ctx())) {
      // A CPU without the type's instructions: autocast changes nothing in
      // the float32 kernels (the layers round around them:
      // LowPrecisionAgainstRoundedOperands), so their bits.
      ++in_float32;
      const ConvCase k = conv2d(3, 8, 9, 7, 12, 3, 3, 2, 1);
      SCOPED_TRACE(::testing::Message() << k << " " << dtype_name(t) << " in float32");
      const Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
      const Shape ys = kernels::conv_output_shape(2, x.shape(), w.shape(), k.geometry());
      const Tensor dy = ft::random_tensor(ys, rng), dw0 = ft::random_tensor(w.shape(), rng);
      const Tensor xd = up(x), wd = up(w), dyd = up(dy);
      Tensor got[2][3];  // autocast off, on: y, dx, dw
      for (int on = 0; on < 2; ++on) {
        ctx().math = on ? m : MathOptions{};
        Tensor yd = poisoned(ys), dxd = poisoned(x.shape()), dwd = up(dw0);
        kernels::conv_forward(ctx(), 2, xd, wd, nullptr, k.geometry(), yd);
        kernels::conv_backward(ctx(), 2, xd, wd, dyd, k.geometry(), &dxd, dwd, nullptr);
        got[on][0] = down(yd);
        got[on][1] = down(dxd);
        got[on][2] = down(dwd);
      }
      EXPECT_TRUE(ft::same_bits(got[1][0], got[0][0])) << "y";
      EXPECT_TRUE(ft::same_bits(got[1][1], got[0][1])) << "dx";
      EXPECT_TRUE(ft::same_bits(got[1][2], got[0][2])) << "dw";
      EXPECT_TRUE(matches(got[1][0], naive_conv(k, x, w, nullptr, &dy).y, 1e-4, 1e-4)) << "y's values";
      continue;
    }
    ++checked;
    const double u = std::ldexp(1.0, t == DType::BF16 ? -9 : -11);
    const auto rounded = [&](const Tensor& v) {
      return ft::float32_values(ft::stored_copy(v, t, MemoryFormat::Contiguous));
    };
    const auto representable = [&](const Tensor& v) {
      const Tensor r = rounded(v);
      for (int64_t i = 0; i < v.numel(); ++i)
        if (r.f32()[i] != v.f32()[i]) return false;
      return true;
    };
    for (const ConvCase& k : {conv2d(3, 8, 9, 7, 12, 3, 3, 2, 1), ConvCase{2, 4, 5, 6, 7, 6, 3, 3, 3, 1, 1}}) {
      SCOPED_TRACE(::testing::Message() << k << " " << dtype_name(t));
      const int s = k.spatial();
      const Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
      const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry());
      const Tensor dy = ft::random_tensor(ys, rng), dw0 = ft::random_tensor(w.shape(), rng);
      Tensor yd = poisoned(ys), dxd = poisoned(x.shape()), dwd = up(dw0);
      const Tensor xd = up(x), wd = up(w), dyd = up(dy);
      kernels::conv_forward(ctx(), s, xd, wd, nullptr, k.geometry(), yd);
      kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), &dxd, dwd, nullptr);
      const Tensor xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
      const ConvRef r = naive_conv(k, xr, wr, nullptr, &dyr);
      const Tensor y = down(yd), dx = down(dxd), dw = down(dwd);
      EXPECT_TRUE(representable(y)) << "y rounded";
      EXPECT_TRUE(representable(dx)) << "dx rounded";
      const auto as_tensor = [](const std::vector<double>& v, const Shape& sh) {
        Tensor o = Tensor::empty(sh);
        for (int64_t i = 0; i < o.numel(); ++i) o.f32()[i] = static_cast<float>(v[static_cast<size_t>(i)]);
        return o;
      };
      EXPECT_TRUE(cudatest::close(y, as_tensor(r.y, ys), 4 * u)) << "y";
      EXPECT_TRUE(cudatest::close(dx, as_tensor(r.dx, x.shape()), 4 * u)) << "dx";
      Tensor term = Tensor::empty(w.shape());
      for (int64_t i = 0; i < w.numel(); ++i) term.f32()[i] = dw.f32()[i] - dw0.f32()[i];
      EXPECT_TRUE(cudatest::close(term, as_tensor(r.dw, w.shape()), 4 * u + 1e-6)) << "dw's term";
      // Into a zeroed dw the term itself: low-type values.
      Tensor dwz = up(Tensor::zeros(w.shape()));
      kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), nullptr, dwz, nullptr);
      EXPECT_TRUE(representable(down(dwz))) << "dw's term rounded";
      // db is summed from dy as given (kernels/conv.h), unrounded here.
      Tensor dbd = up(Tensor::zeros(Shape{k.oc})), none;
      kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), nullptr, none, &dbd);
      const ConvRef raw = naive_conv(k, x, w, nullptr, &dy);
      EXPECT_TRUE(matches(down(dbd), raw.db, 1e-5, 1e-5)) << "db from dy as given";
    }
    // The operands themselves are rounded before the product: with x = w =
    // 1 + 5 * 2^-9 (1 + 2^-7 in bfloat16) a 1x1 convolution gives
    // round((1 + 2^-7)^2) = 1 + 2^-6, where the exact product would round
    // to 1 + 3 * 2^-7.
    if (t == DType::BF16) {
      const ConvCase one = conv2d(1, 1, 1, 1, 1, 1, 1, 1, 0);
      Tensor v = Tensor::empty(one.x());
      v.f32()[0] = 1.0f + 5.0f / 512.0f;
      Tensor y1 = poisoned(Shape{1, 1, 1, 1});
      kernels::conv_forward(ctx(), 2, up(v), up(v.view(one.weight())), nullptr, one.geometry(), y1);
      EXPECT_EQ(down(y1).f32()[0], 1.0f + 1.0f / 64.0f) << "x and w rounded before the product";
    }
  }
  ctx().math = MathOptions{};
  if (on_cuda()) EXPECT_EQ(checked, 2) << "CUDA rounds in both low types";
  EXPECT_EQ(checked + in_float32, 2);
}

// Activations in low-type storage, either format: x and dy read as stored,
// y and dx written in x's storage (rounded once), against the direct
// convolution of the stored values; w, b and the gradients stay float32.
TEST_P(ConvOnBackend, LowStorageInEitherFormat) {
  std::mt19937_64 rng(78);
  for (const ft::StorageCase& sc : ft::low_storage_cases())
    for (const ConvCase& k : {conv2d(3, 8, 9, 7, 12, 3, 3, 2, 1), ConvCase{2, 4, 5, 6, 7, 6, 3, 3, 3, 1, 1}}) {
      SCOPED_TRACE(::testing::Message() << k << " " << sc.name());
      const int s = k.spatial();
      const Tensor x = ft::stored_copy(ft::random_tensor(k.x(), rng), sc.dtype, sc.format);
      const Tensor w = ft::random_tensor(k.weight(), rng), b = ft::random_tensor(Shape{k.oc}, rng);
      const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry());
      const Tensor dy = ft::stored_copy(ft::random_tensor(ys, rng), sc.dtype, sc.format);
      Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(Tensor::zeros(w.shape())),
             dbd = up(Tensor::zeros(Shape{k.oc}));
      Tensor yd = up(ft::poisoned_stored(ys, sc.dtype, sc.format)),
             dxd = up(ft::poisoned_stored(x.shape(), sc.dtype, sc.format));
      kernels::conv_forward(ctx(), s, xd, wd, &bd, k.geometry(), yd);
      kernels::conv_backward(ctx(), s, xd, wd, dyd, k.geometry(), &dxd, dwd, &dbd);
      const Tensor y = down(yd), dx = down(dxd);
      ASSERT_EQ(y.dtype(), sc.dtype);
      ASSERT_EQ(y.format(), sc.format);
      const Tensor dy32 = ft::float32_values(dy);
      const ConvRef r = naive_conv(k, ft::float32_values(x), w, &b, &dy32);
      const double u = ft::unit_roundoff(sc.dtype);
      EXPECT_TRUE(matches(ft::float32_values(y), r.y, u + 1e-4, 2 * u + 1e-4)) << "y";
      EXPECT_TRUE(matches(ft::float32_values(dx), r.dx, u + 1e-4, 2 * u + 1e-4)) << "dx";
      EXPECT_TRUE(matches(down(dwd), r.dw, 1e-4, 1e-3)) << "dw";
      EXPECT_TRUE(matches(down(dbd), r.db, 1e-4, 1e-3)) << "db";
    }
}

// float32 activations channels-last (what the CPU's staging of low-type
// channels-last activations now hands its float32 kernels): the same bits
// as the contiguous tensors of the same values, in every pass and on the
// paths the CPU takes by shape and options: channels-last and blocked
// layouts inside oneDNN (6 -> 16 and 16 -> 16 channels), weight gradients
// cut into several calls (more than 4,096 terms), image-by-image
// split-invariant math, float64 gradients, and 3-D weight gradients over
// depth slices. Mixed formats too: a contiguous x with a channels-last y.
TEST_P(ConvOnBackend, Float32ChannelsLastGivesTheContiguousBits) {
  std::mt19937_64 rng(80);
  MathOptions split;
  split.split_invariant = true;
  struct Case {
    ConvCase k;
    MathOptions math;
    DType grad;
    const char* slices;
  };
  const Case cases[] = {
      {conv2d(4, 6, 12, 12, 16, 5, 5, 1, 0), {}, DType::F32, "auto"},
      {conv2d(3, 16, 9, 10, 16, 3, 3, 1, 1), {}, DType::F32, "auto"},
      {conv2d(2, 16, 48, 48, 16, 3, 3, 1, 1), {}, DType::F32, "auto"},  // 4,608 terms: two calls
      {conv2d(3, 5, 7, 9, 4, 3, 3, 2, 1), split, DType::F32, "auto"},
      {conv2d(3, 5, 7, 9, 4, 3, 3, 1, 1), {}, DType::F64, "auto"},
      {{2, 3, 5, 6, 7, 4, 3, 3, 3, 1, 1}, {}, DType::F32, "always"},
      {{2, 3, 5, 6, 7, 4, 3, 3, 3, 2, 1}, {}, DType::F32, "never"},
      {{2, 3, 5, 6, 7, 4, 3, 3, 3, 1, 1}, {}, DType::F64, "always"},
  };
  for (const Case& c : cases) {
    if (on_cuda() && (c.grad == DType::F64 || c.math.split_invariant)) continue;  // CPU options
    SCOPED_TRACE(::testing::Message() << c.k << " split-invariant " << c.math.split_invariant << " gradients "
                                      << dtype_name(c.grad) << " slices " << c.slices);
    ASSERT_EQ(setenv("FANOUT_CONV3D_WEIGHT_SLICES", c.slices, 1), 0);
    ctx().math = c.math;
    const int s = c.k.spatial();
    const Tensor x = ft::random_tensor(c.k.x(), rng), w = ft::random_tensor(c.k.weight(), rng);
    const Tensor b = ft::random_tensor(Shape{c.k.oc}, rng);
    const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), c.k.geometry());
    const Tensor dy = ft::random_tensor(ys, rng);
    // (x format, y format): both contiguous (the reference), both channels-last, and mixed.
    const std::pair<MemoryFormat, MemoryFormat> formats[] = {
        {MemoryFormat::Contiguous, MemoryFormat::Contiguous},
        {MemoryFormat::ChannelsLast, MemoryFormat::ChannelsLast},
        {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}};
    std::vector<Tensor> got[4];  // y, dx, dw, db for each pair of formats
    for (const auto& [xf, yf] : formats) {
      const Tensor xd = up(ft::stored_copy(x, DType::F32, xf)), wd = up(w), bd = up(b),
                   dyd = up(ft::stored_copy(dy, DType::F32, yf));
      Tensor yd = up(ft::poisoned_stored(ys, DType::F32, yf)), dxd = up(ft::poisoned_stored(x.shape(), DType::F32, xf));
      Tensor dwd = up(Tensor::zeros(w.shape(), c.grad)), dbd = up(Tensor::zeros(Shape{c.k.oc}, c.grad));
      kernels::conv_forward(ctx(), s, xd, wd, &bd, c.k.geometry(), yd);
      kernels::conv_backward(ctx(), s, xd, wd, dyd, c.k.geometry(), &dxd, dwd, &dbd);
      const Tensor y = down(yd), dx = down(dxd);
      ASSERT_EQ(y.format(), yf);
      ASSERT_EQ(dx.format(), xf);
      got[0].push_back(ft::float32_values(y));
      got[1].push_back(ft::float32_values(dx));
      got[2].push_back(down(dwd));
      got[3].push_back(down(dbd));
    }
    const char* names[] = {"y", "dx", "dw", "db"};
    for (int o = 0; o < 4; ++o)
      for (size_t f = 1; f < got[o].size(); ++f)
        EXPECT_TRUE(ft::same_bits(got[o][f], got[o][0])) << names[o] << ", formats " << f;
    // And the reference's values (the contiguous path's own check is ForwardBackwardAgainstDirectConvolution).
    const ConvRef r = naive_conv(c.k, x, w, &b, &dy);
    EXPECT_TRUE(matches(got[0][1], r.y, 1e-4, 1e-4)) << "y";
    EXPECT_TRUE(matches(got[1][1], r.dx, 1e-4, 1e-4)) << "dx";
  }
  unsetenv("FANOUT_CONV3D_WEIGHT_SLICES");
}

// The per-channel bias on every storage (float32 and the low types, either
// format; 2-D and 3-D): y + b[c] rounded once to y's type, and db += the sums
// of dy over samples and positions (float64 sums of the stored values).
TEST_P(ConvOnBackend, ChannelBiasOnEveryStorage) {
  std::mt19937_64 rng(79);
  std::vector<ft::StorageCase> cases = ft::low_storage_cases();
  cases.push_back({DType::F32, MemoryFormat::Contiguous});
  for (const ft::StorageCase& sc : cases)
    for (const Shape& s : {Shape{3, 5, 4, 7}, Shape{2, 300, 2, 3, 2}}) {
      SCOPED_TRACE(sc.name() + " " + s.str());
      const int64_t c = s[1], per = s.numel() / (s[0] * c);
      const Tensor y = ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format);
      const Tensor dy = ft::stored_copy(ft::random_tensor(s, rng), sc.dtype, sc.format);
      const Tensor b = ft::random_tensor(Shape{c}, rng), db0 = ft::random_tensor(Shape{c}, rng);
      Tensor yd = up(y), dbd = up(db0);
      kernels::channel_bias_add(ctx(), yd, up(b));
      kernels::channel_bias_grad(ctx(), up(dy), dbd);
      const Tensor got = down(yd), db = down(dbd);
      ASSERT_EQ(got.dtype(), sc.dtype);
      ASSERT_EQ(got.format(), sc.format);
      const double u = ft::unit_roundoff(sc.dtype);
      std::vector<double> sums(static_cast<size_t>(c), 0.0);
      for (int64_t i = 0; i < s.numel(); ++i) {
        const int64_t ch = i / per % c;
        const double want = ft::stored(y, i) + double(b.f32()[ch]);
        ASSERT_NEAR(ft::stored(got, i), want, u * std::abs(want) + 1e-7) << i;
        sums[static_cast<size_t>(ch)] += ft::stored(dy, i);
      }
      for (int64_t ch = 0; ch < c; ++ch)
        ASSERT_NEAR(db.f32()[ch], db0.f32()[ch] + sums[static_cast<size_t>(ch)], 1e-5) << ch;
    }
}

TEST_P(ConvOnBackend, Tf32WithinTf32Tolerance) {
  if (!on_cuda()) GTEST_SKIP() << "TF32 is a CUDA math mode; the CPU computes in float32";
  std::mt19937_64 rng(500);
  MathOptions m;
  m.allow_tf32 = true;
  check(conv2d(4, 32, 10, 10, 48, 3, 3, 1, 1), true, m, 3e-2, rng);
  check({2, 16, 6, 8, 7, 24, 3, 3, 3, 1, 1}, true, m, 3e-2, rng);
}

TEST_P(ConvOnBackend, GradientsByCentralDifferences) {
  std::mt19937_64 rng(52);
  const std::vector<ConvCase> picked = {cases2d()[0], cases2d()[1], cases2d()[5], cases2d()[8],
                                        cases2d()[10], cases2d()[12], cases3d()[0], cases3d()[1],
                                        cases3d()[4], cases3d()[6], cases3d()[8], cases3d()[11]};
  for (const ConvCase& k : picked) {
    const int s = k.spatial();
    Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry());
    Tensor r = ft::random_tensor(ys, rng);
    Tensor yd = poisoned(ys);
    auto loss = [&] {  // <r, y>, accumulated in float64
      Tensor xe = up(x), we = up(w), be = up(b);
      kernels::conv_forward(ctx(), s, xe, we, &be, k.geometry(), yd);
      return ft::dot(down(yd), r);
    };
    Tensor xd = up(x), wd = up(w), rd = up(r), dxd = poisoned(x.shape());
    Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc}));
    kernels::conv_backward(ctx(), s, xd, wd, rd, k.geometry(), &dxd, dwd, &dbd);
    const Tensor dx = down(dxd), dw = down(dwd), db = down(dbd);
    for (auto [t, gr, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
      auto res = ft::grad_check_detail(loss, *t, *gr);
      EXPECT_LT(res.worst, 1e-2) << k << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << k << " d" << name;
      EXPECT_GT(ft::l2_norm(*gr), 0.0) << k << " d" << name;
    }
  }
}

TEST_P(ConvOnBackend, BackwardTwiceDoublesParameterGradients) {
  std::mt19937_64 rng(53);
  for (int s : kRanks) {
    const ConvCase k = cases(s)[1];
    SCOPED_TRACE(::testing::Message() << k);
    Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
    const kernels::ConvGeometry g = k.geometry();
    Tensor dy = ft::random_tensor(kernels::conv_output_shape(s, x.shape(), w.shape(), g), rng);
    Tensor xd = up(x), wd = up(w), dyd = up(dy);
    Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc})), dxd = poisoned(x.shape());
    kernels::conv_backward(ctx(), s, xd, wd, dyd, g, nullptr, dwd, &dbd);
    const Tensor dw1 = down(dwd), db1 = down(dbd);
    kernels::conv_backward(ctx(), s, xd, wd, dyd, g, &dxd, dwd, &dbd);
    const Tensor dx1 = down(dxd);
    dxd.copy_from(poisoned(x.shape()));
    kernels::conv_backward(ctx(), s, xd, wd, dyd, g, &dxd, dwd, nullptr);  // dx is written, not accumulated
    const Tensor dw = down(dwd), db = down(dbd), dx = down(dxd);
    for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.f32()[i], 3 * dw1.f32()[i], 1e-4);
    for (int64_t i = 0; i < db.numel(); ++i) EXPECT_NEAR(db.f32()[i], 2 * db1.f32()[i], 1e-4);
    // Written, not accumulated: equal up to the order of cuDNN's (possibly atomic) sums.
    for (int64_t i = 0; i < dx.numel(); ++i)
      EXPECT_NEAR(dx.f32()[i], dx1.f32()[i], 1e-5 * (1 + std::abs(dx1.f32()[i])));
    EXPECT_GT(ft::l2_norm(dw1), 0.0);
    EXPECT_GT(ft::l2_norm(db1), 0.0);
  }
}

// float64 gradients (CPU): the reference's values, and the same bits whether
// the batch is processed whole or in parts, in any order; also for a large
// volume. With them the CPU runs every pass image by image, so dx is
// split-invariant too.
TEST(Conv, Float64GradientsDoNotDependOnTheSplit) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(55);
  for (const ConvCase& k0 : {cases2d()[0], cases2d()[1], cases2d()[4], cases2d()[7], cases3d()[0], cases3d()[1],
                             cases3d()[3], cases3d()[6], large_cases()[0]}) {
    ConvCase k = k0;
    k.n = 5;
    const int s = k.spatial();
    Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
    const kernels::ConvGeometry g = k.geometry();
    const Shape ys = kernels::conv_output_shape(s, x.shape(), w.shape(), g);
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape(), DType::F64);
    Tensor db = Tensor::zeros(Shape{k.oc}, DType::F64);
    kernels::conv_backward(ctx, s, x, w, dy, g, &dx, dw, &db);
    const ConvRef r = naive_conv(k, x, w, nullptr, &dy);
    double scale = 1;
    for (double v : r.dw) scale = std::max(scale, std::abs(v));
    EXPECT_LT(ft::max_rel_diff(dx, r.dx), 1e-4) << k;
    for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.f64()[i], r.dw[i], 1e-5 * scale) << k << " dw at " << i;
    for (int64_t i = 0; i < db.numel(); ++i) ASSERT_NEAR(db.f64()[i], r.db[i], 1e-3) << k << " db at " << i;

    Tensor dx2 = Tensor::empty(x.shape()), dw2 = Tensor::zeros(w.shape(), DType::F64);
    Tensor db2 = Tensor::zeros(Shape{k.oc}, DType::F64);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{3, 5}, {0, 1}, {1, 3}}) {
      Tensor dxs = dx2.slice(lo, hi);
      kernels::conv_backward(ctx, s, x.slice(lo, hi), w, dy.slice(lo, hi), g, &dxs, dw2, &db2);
    }
    EXPECT_TRUE(ft::same_bits(dw2, dw)) << k;
    EXPECT_TRUE(ft::same_bits(db2, db)) << k;
    EXPECT_TRUE(ft::same_bits(dx2, dx)) << k;
    EXPECT_GT(ft::l2_norm(dx), 0.0) << k;
  }
}

TEST(Conv, WorkspaceGrowsAcrossCalls) {
  // A small conv, then one that needs a larger workspace, then the small one again.
  Context ctx(Device::cpu());
  std::mt19937_64 rng(54);
  for (const ConvCase& k : {cases2d()[2], cases2d()[8], cases2d()[2], cases3d()[2], cases3d()[6], cases3d()[2]}) {
    const int s = k.spatial();
    Tensor x = ft::random_tensor(k.x(), rng), w = ft::random_tensor(k.weight(), rng);
    Tensor y = Tensor::empty(kernels::conv_output_shape(s, x.shape(), w.shape(), k.geometry()));
    ft::poison(y);
    kernels::conv_forward(ctx, s, x, w, nullptr, k.geometry(), y);
    EXPECT_LT(ft::max_rel_diff(y, naive_conv(k, x, w, nullptr, nullptr).y), 1e-4) << k;
  }
  EXPECT_GT(ctx.workspace_size(), 0u);
}

TEST_P(ConvOnBackend, ShapeMismatchesThrow) {
  Context& ctx = this->ctx();
  const kernels::ConvGeometry g{1, 1};
  for (int s : kRanks) {
    SCOPED_TRACE(s);
    const ConvCase k = cases(s)[0];  // 3x3(x3) "same"
    Shape w_channels = k.weight(), y_narrow = k.x(), dw_narrow = k.weight();
    w_channels[1] += 1;
    y_narrow[1] = k.oc;
    y_narrow[s + 1] -= 1;
    dw_narrow[s + 1] -= 1;
    Shape ys = k.x(), dx_narrow = k.x();
    ys[1] = k.oc;
    dx_narrow[s + 1] -= 1;
    Tensor x = up(Tensor::zeros(k.x())), w = up(Tensor::zeros(k.weight())), y = up(Tensor::zeros(ys));
    Tensor w_bad = up(Tensor::zeros(w_channels)), y_bad = up(Tensor::zeros(y_narrow));
    Tensor b_bad = up(Tensor::zeros(Shape{k.oc + 1})), x_i32 = up(Tensor::zeros(k.x(), DType::I32));
    EXPECT_NO_THROW(kernels::conv_forward(ctx, s, x, w, nullptr, g, y));
    EXPECT_THROW(kernels::conv_forward(ctx, s, x, w_bad, nullptr, g, y), Error);
    EXPECT_THROW(kernels::conv_forward(ctx, s, x, w, nullptr, g, y_bad), Error);
    EXPECT_THROW(kernels::conv_forward(ctx, s, x, w, &b_bad, g, y), Error);
    EXPECT_THROW(kernels::conv_forward(ctx, s, x_i32, w, nullptr, g, y), Error);
    EXPECT_THROW(kernels::conv_forward(ctx, 5 - s, x, w, nullptr, g, y), Error);
    Tensor dw_bad = up(Tensor::zeros(dw_narrow)), dw = up(Tensor::zeros(w.shape()));
    Tensor dx_bad = up(Tensor::zeros(dx_narrow));
    EXPECT_THROW(kernels::conv_backward(ctx, s, x, w, y, g, nullptr, dw_bad, nullptr), Error);
    EXPECT_THROW(kernels::conv_backward(ctx, s, x, w, y, g, &dx_bad, dw, nullptr), Error);
    EXPECT_THROW(kernels::conv_backward(ctx, s, x, w, y_bad, g, nullptr, dw, nullptr), Error);
    try {
      kernels::conv_forward(ctx, s, x, w, nullptr, g, y_bad);
      FAIL();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(s == 2 ? "conv2d_forward" : "conv3d_forward"), std::string::npos) << msg;
      EXPECT_NE(msg.find(y_narrow.str()), std::string::npos) << msg;
      EXPECT_NE(msg.find(k.x().str()), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace fanout
