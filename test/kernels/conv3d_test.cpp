// 3-D convolution on every backend (oneDNN on CPU, cuDNN on CUDA)
// against a direct double-precision convolution, forward and backward:
// stride 1/2, padding 0/1/2, kernels 1/3/5 and non-cubic ones, volumes with
// D != H != W, windows entirely in the padding, large volumes; math options; central-difference gradient checks;
// += semantics; float64 gradients independent of the batch split; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/conv.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct Conv3dCase {
  int64_t n, c, d, h, w, oc, kd, kh, kw, stride, pad;
};
std::ostream& operator<<(std::ostream& os, const Conv3dCase& k) {
  return os << "N" << k.n << " C" << k.c << " " << k.d << "x" << k.h << "x" << k.w << " OC" << k.oc << " K" << k.kd
            << "x" << k.kh << "x" << k.kw << " s" << k.stride << " p" << k.pad;
}

const std::vector<Conv3dCase>& cases() {
  static const std::vector<Conv3dCase> v = {
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

// Large volumes: 6,348 to 40,500 output positions per image, so the CPU
// cuts their weight gradients into one call per image (kernels/cpu/conv.cpp).
const std::vector<Conv3dCase>& large_cases() {
  static const std::vector<Conv3dCase> v = {
      {1, 16, 3, 46, 46, 3, 5, 5, 5, 1, 2},
      {2, 8, 5, 90, 90, 2, 3, 3, 3, 1, 1},
      {1, 16, 7, 92, 91, 2, 5, 5, 5, 2, 2},
  };
  return v;
}

struct ConvRef {
  std::vector<double> y, dx, dw, db;
};

// Direct 3-D convolution and its gradients in double.
ConvRef naive_conv3d(const Conv3dCase& k, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* dy) {
  const int64_t od = (k.d + 2 * k.pad - k.kd) / k.stride + 1, oh = (k.h + 2 * k.pad - k.kh) / k.stride + 1,
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
              for (int64_t a = 0; a < k.kd; ++a)
                for (int64_t e = 0; e < k.kh; ++e)
                  for (int64_t f = 0; f < k.kw; ++f) {
                    const int64_t id = i * k.stride - k.pad + a, ih = j * k.stride - k.pad + e,
                                  iw = l * k.stride - k.pad + f;
                    if (id < 0 || id >= k.d || ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                    const int64_t xi = (((n * k.c + c) * k.d + id) * k.h + ih) * k.w + iw;
                    const int64_t wi = (((o * k.c + c) * k.kd + a) * k.kh + e) * k.kw + f;
                    s += double(xp[xi]) * wp[wi];
                    if (dy) {
                      r.dx[xi] += g * wp[wi];
                      r.dw[wi] += g * xp[xi];
                    }
                  }
            r.y[yi] = s;
          }
  return r;
}

Shape x_shape(const Conv3dCase& k) { return Shape{k.n, k.c, k.d, k.h, k.w}; }
Shape w_shape(const Conv3dCase& k) { return Shape{k.oc, k.c, k.kd, k.kh, k.kw}; }

TEST(Conv3d, OutputShape) {
  using kernels::conv3d_output_shape;
  EXPECT_EQ(conv3d_output_shape(Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {1, 1}), (Shape{2, 4, 5, 6, 7}));
  EXPECT_EQ(conv3d_output_shape(Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {2, 1}), (Shape{2, 4, 3, 3, 4}));
  EXPECT_EQ(conv3d_output_shape(Shape{1, 1, 16, 32, 24}, Shape{8, 1, 5, 5, 5}, {1, 0}), (Shape{1, 8, 12, 28, 20}));
  EXPECT_EQ(conv3d_output_shape(Shape{1, 2, 3, 5, 4}, Shape{3, 2, 5, 5, 5}, {1, 2}), (Shape{1, 3, 3, 5, 4}));
  EXPECT_THROW(conv3d_output_shape(Shape{2, 3, 5, 6, 7}, Shape{4, 2, 3, 3, 3}, {1, 1}), Error);  // channels
  EXPECT_THROW(conv3d_output_shape(Shape{2, 3, 2, 6, 7}, Shape{4, 3, 5, 5, 5}, {1, 1}), Error);  // kernel too deep
  EXPECT_THROW(conv3d_output_shape(Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {0, 1}), Error);  // stride 0
  EXPECT_THROW(conv3d_output_shape(Shape{2, 3, 5, 6, 7}, Shape{4, 3, 3, 3, 3}, {1, -1}), Error); // padding < 0
  EXPECT_THROW(conv3d_output_shape(Shape{3, 5, 6, 7}, Shape{4, 3, 3, 3}, {1, 1}), Error);        // 2-D
}

class Conv3dOnBackend : public ft::BackendTest {
 protected:
  // Forward and backward against the direct convolution: within 1e-4
  // (relative to the largest reference value) on CPU, within `cuda_rtol` on
  // CUDA. y and dx are poisoned (=); dw and db start from random values (+=);
  // a second backward without dx accumulates again.
  void check(const Conv3dCase& k, bool with_bias, const MathOptions& math, double cuda_rtol, std::mt19937_64& rng) {
    SCOPED_TRACE(::testing::Message() << k << " bias " << with_bias << " deterministic " << math.deterministic
                                      << " benchmark " << math.cudnn_benchmark << " tf32 " << math.allow_tf32);
    ctx().math = math;
    Tensor x = ft::random_tensor(x_shape(k), rng);
    Tensor w = ft::random_tensor(w_shape(k), rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv3dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv3d_output_shape(x.shape(), w.shape(), g);
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dw0 = ft::random_tensor(w.shape(), rng), db0 = ft::random_tensor(Shape{k.oc}, rng);
    Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(dw0), dbd = up(db0);
    Tensor yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::conv3d_forward(ctx(), xd, wd, with_bias ? &bd : nullptr, g, yd);
    kernels::conv3d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, &dbd);
    ConvRef r = naive_conv3d(k, x, w, with_bias ? &b : nullptr, &dy);
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

    kernels::conv3d_backward(ctx(), xd, wd, dyd, g, nullptr, dwd, &dbd);
    for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += fresh.dw[i];
    for (int64_t i = 0; i < k.oc; ++i) r.db[i] += fresh.db[i];
    EXPECT_TRUE(matches(down(dwd), r.dw, 1e-4, cuda_rtol)) << "dw after a second backward without dx";
    EXPECT_TRUE(matches(down(dbd), r.db, 1e-4, cuda_rtol)) << "db after a second backward";
  }
};
FANOUT_ON_EVERY_BACKEND(Conv3dOnBackend);

TEST_P(Conv3dOnBackend, ForwardBackwardAgainstDirectConvolution) {
  std::mt19937_64 rng(301);
  int variant = 0;
  for (const Conv3dCase& k : cases()) check(k, (variant++ % 2) == 0, {}, 1e-4, rng);
}

TEST_P(Conv3dOnBackend, CubicKernelGridAgainstDirectConvolution) {
  std::mt19937_64 rng(302);
  for (int64_t k : {1, 3, 5})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1, 2}) check({2, 3, 5, 7, 6, 4, k, k, k, stride, pad}, stride == 1, {}, 1e-4, rng);
}

TEST_P(Conv3dOnBackend, LargeVolumesAgainstDirectConvolution) {
  std::mt19937_64 rng(303);
  int variant = 0;
  for (const Conv3dCase& k : large_cases()) check(k, (variant++ % 2) == 0, {}, 1e-3, rng);
}

TEST_P(Conv3dOnBackend, MathOptionsAgainstDirectConvolution) {
  std::mt19937_64 rng(304);
  MathOptions det;
  det.deterministic = true;
  for (int64_t k : {1, 3}) check({2, 3, 5, 6, 7, 4, k, k, k, 2, 1}, true, det, 1e-4, rng);
  MathOptions bench;
  bench.cudnn_benchmark = true;
  for (int64_t k : {1, 3}) check({2, 3, 5, 6, 7, 4, k, k, k, 1, 1}, true, bench, 1e-4, rng);
  bench.deterministic = true;
  check({2, 3, 5, 6, 7, 4, 3, 3, 3, 2, 0}, false, bench, 1e-4, rng);
  // K = 16 * 27 = 432 per output.
  check({2, 16, 6, 9, 8, 24, 3, 3, 3, 1, 1}, true, {}, 1e-3, rng);
}

TEST_P(Conv3dOnBackend, Tf32WithinTf32Tolerance) {
  if (!on_cuda()) GTEST_SKIP() << "TF32 is a CUDA math mode; the CPU computes in float32";
  std::mt19937_64 rng(305);
  MathOptions m;
  m.allow_tf32 = true;
  check({2, 16, 6, 8, 7, 24, 3, 3, 3, 1, 1}, true, m, 3e-2, rng);
}

TEST_P(Conv3dOnBackend, GradientsByCentralDifferences) {
  std::mt19937_64 rng(306);
  for (const Conv3dCase& k : {cases()[0], cases()[1], cases()[4], cases()[6], cases()[8], cases()[11]}) {
    Tensor x = ft::random_tensor(x_shape(k), rng);
    Tensor w = ft::random_tensor(w_shape(k), rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv3dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv3d_output_shape(x.shape(), w.shape(), g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor yd = poisoned(ys);
    auto loss = [&] {  // <r, y>, accumulated in float64
      Tensor xe = up(x), we = up(w), be = up(b);
      kernels::conv3d_forward(ctx(), xe, we, &be, g, yd);
      return ft::dot(down(yd), r);
    };
    Tensor xd = up(x), wd = up(w), rd = up(r), dxd = poisoned(x.shape());
    Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc}));
    kernels::conv3d_backward(ctx(), xd, wd, rd, g, &dxd, dwd, &dbd);
    const Tensor dx = down(dxd), dw = down(dwd), db = down(dbd);
    for (auto [t, gr, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
      auto res = ft::grad_check_detail(loss, *t, *gr);
      EXPECT_LT(res.worst, 1e-2) << k << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << k << " d" << name;
      EXPECT_GT(ft::l2_norm(*gr), 0.0) << k << " d" << name;
    }
  }
}

TEST_P(Conv3dOnBackend, BackwardTwiceDoublesParameterGradients) {
  std::mt19937_64 rng(307);
  const Conv3dCase k = cases()[1];
  Tensor x = ft::random_tensor(x_shape(k), rng);
  Tensor w = ft::random_tensor(w_shape(k), rng);
  const kernels::Conv3dGeometry g{k.stride, k.pad};
  Tensor dy = ft::random_tensor(kernels::conv3d_output_shape(x.shape(), w.shape(), g), rng);
  Tensor xd = up(x), wd = up(w), dyd = up(dy);
  Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc})), dxd = poisoned(x.shape());
  kernels::conv3d_backward(ctx(), xd, wd, dyd, g, nullptr, dwd, &dbd);
  const Tensor dw1 = down(dwd), db1 = down(dbd);
  kernels::conv3d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, &dbd);
  const Tensor dx1 = down(dxd);
  dxd.copy_from(poisoned(x.shape()));
  kernels::conv3d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, nullptr);  // dx is written, not accumulated
  const Tensor dw = down(dwd), db = down(dbd), dx = down(dxd);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.f32()[i], 3 * dw1.f32()[i], 1e-4);
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_NEAR(db.f32()[i], 2 * db1.f32()[i], 1e-4);
  // Written, not accumulated: equal up to the order of cuDNN's (possibly atomic) sums.
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_NEAR(dx.f32()[i], dx1.f32()[i], 1e-5 * (1 + std::abs(dx1.f32()[i])));
  EXPECT_GT(ft::l2_norm(dw1), 0.0);
  EXPECT_GT(ft::l2_norm(db1), 0.0);
}

// float64 gradients (CPU): the reference's values, and the same bits whether
// the batch is processed whole or in parts, in any order; also for a large
// volume.
TEST(Conv3d, Float64GradientsDoNotDependOnTheSplit) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(308);
  for (const Conv3dCase& k0 : {cases()[0], cases()[1], cases()[3], cases()[6], large_cases()[0]}) {
    Conv3dCase k = k0;
    k.n = 5;
    Tensor x = ft::random_tensor(x_shape(k), rng);
    Tensor w = ft::random_tensor(w_shape(k), rng);
    const kernels::Conv3dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv3d_output_shape(x.shape(), w.shape(), g);
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape(), DType::F64);
    Tensor db = Tensor::zeros(Shape{k.oc}, DType::F64);
    kernels::conv3d_backward(ctx, x, w, dy, g, &dx, dw, &db);
    const ConvRef r = naive_conv3d(k, x, w, nullptr, &dy);
    double scale = 1;
    for (double v : r.dw) scale = std::max(scale, std::abs(v));
    EXPECT_TRUE(ft::max_rel_diff(dx, r.dx) < 1e-4) << k;
    for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.f64()[i], r.dw[i], 1e-5 * scale) << k << " dw at " << i;
    for (int64_t i = 0; i < db.numel(); ++i) ASSERT_NEAR(db.f64()[i], r.db[i], 1e-3) << k << " db at " << i;

    Tensor dx2 = Tensor::empty(x.shape()), dw2 = Tensor::zeros(w.shape(), DType::F64);
    Tensor db2 = Tensor::zeros(Shape{k.oc}, DType::F64);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{3, 5}, {0, 1}, {1, 3}}) {
      Tensor dxs = dx2.slice(lo, hi);
      kernels::conv3d_backward(ctx, x.slice(lo, hi), w, dy.slice(lo, hi), g, &dxs, dw2, &db2);
    }
    EXPECT_TRUE(ft::same_bits(dw2, dw)) << k;
    EXPECT_TRUE(ft::same_bits(db2, db)) << k;
    EXPECT_TRUE(ft::same_bits(dx2, dx)) << k;
    EXPECT_GT(ft::l2_norm(dx), 0.0) << k;
  }
}

TEST(Conv3d, WorkspaceGrowsAcrossCalls) {
  // A small conv, then one that needs a larger column buffer, then the small one again.
  Context ctx(Device::cpu());
  std::mt19937_64 rng(309);
  for (const Conv3dCase& k : {cases()[2], cases()[6], cases()[2]}) {
    Tensor x = ft::random_tensor(x_shape(k), rng);
    Tensor w = ft::random_tensor(w_shape(k), rng);
    const kernels::Conv3dGeometry g{k.stride, k.pad};
    Tensor y = Tensor::empty(kernels::conv3d_output_shape(x.shape(), w.shape(), g));
    ft::poison(y);
    kernels::conv3d_forward(ctx, x, w, nullptr, g, y);
    EXPECT_LT(ft::max_rel_diff(y, naive_conv3d(k, x, w, nullptr, nullptr).y), 1e-4) << k;
  }
  EXPECT_GT(ctx.workspace_size(), 0u);
}

TEST_P(Conv3dOnBackend, ShapeMismatchesThrow) {
  Context& ctx = this->ctx();
  const kernels::Conv3dGeometry g{1, 1};
  Tensor x = up(Tensor::zeros(Shape{2, 3, 5, 6, 7})), w = up(Tensor::zeros(Shape{4, 3, 3, 3, 3}));
  Tensor y = up(Tensor::zeros(Shape{2, 4, 5, 6, 7}));
  Tensor w_bad = up(Tensor::zeros(Shape{4, 2, 3, 3, 3})), y_bad = up(Tensor::zeros(Shape{2, 4, 5, 6, 6}));
  Tensor b_bad = up(Tensor::zeros(Shape{5})), x_i32 = up(Tensor::zeros(Shape{2, 3, 5, 6, 7}, DType::I32));
  EXPECT_NO_THROW(kernels::conv3d_forward(ctx, x, w, nullptr, g, y));
  EXPECT_THROW(kernels::conv3d_forward(ctx, x, w_bad, nullptr, g, y), Error);
  EXPECT_THROW(kernels::conv3d_forward(ctx, x, w, nullptr, g, y_bad), Error);
  EXPECT_THROW(kernels::conv3d_forward(ctx, x, w, &b_bad, g, y), Error);
  EXPECT_THROW(kernels::conv3d_forward(ctx, x_i32, w, nullptr, g, y), Error);
  Tensor dw_bad = up(Tensor::zeros(Shape{4, 3, 3, 3, 2})), dw = up(Tensor::zeros(w.shape()));
  Tensor dx_bad = up(Tensor::zeros(Shape{2, 3, 5, 6, 6}));
  EXPECT_THROW(kernels::conv3d_backward(ctx, x, w, y, g, nullptr, dw_bad, nullptr), Error);
  EXPECT_THROW(kernels::conv3d_backward(ctx, x, w, y, g, &dx_bad, dw, nullptr), Error);
  EXPECT_THROW(kernels::conv3d_backward(ctx, x, w, y_bad, g, nullptr, dw, nullptr), Error);
  try {
    kernels::conv3d_forward(ctx, x, w, nullptr, g, y_bad);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv3d_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 4, 5, 6, 6)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 3, 5, 6, 7)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
