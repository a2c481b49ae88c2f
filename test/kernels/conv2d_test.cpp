// 2-D convolution on every backend (oneDNN on CPU, cuDNN on CUDA)
// against a direct double-precision convolution, forward and backward, over
// many geometries (stride 1/2, padding 0/1/2, kernel 1/3/5, non-square
// kernels, windows entirely in the padding) and math options (deterministic,
// timed algorithm search, TF32); central-difference gradient checks; +=
// semantics; errors.
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

struct ConvCase {
  int64_t n, c, h, w, oc, kh, kw, stride, pad;
};
std::ostream& operator<<(std::ostream& os, const ConvCase& k) {
  return os << "N" << k.n << " C" << k.c << " " << k.h << "x" << k.w << " OC" << k.oc << " K" << k.kh << "x" << k.kw
            << " s" << k.stride << " p" << k.pad;
}

const std::vector<ConvCase>& cases() {
  static const std::vector<ConvCase> v = {
      {3, 5, 7, 9, 4, 3, 3, 1, 1},  // the usual 3x3 "same"
      {3, 5, 7, 9, 4, 3, 3, 2, 1},  // strided
      {2, 3, 7, 9, 4, 3, 3, 1, 0},  // valid
      {2, 4, 8, 7, 3, 3, 3, 2, 0},
      {2, 3, 8, 6, 5, 1, 1, 1, 0},  // 1x1 (oneDNN's 1x1 kernels)
      {2, 3, 9, 7, 4, 1, 1, 2, 0},  // 1x1 strided (downsample)
      {2, 3, 5, 6, 4, 1, 1, 1, 1},  // border outputs read only padding
      {2, 3, 7, 9, 4, 5, 5, 1, 2},  // 5x5 "same"
      {2, 3, 11, 10, 6, 5, 5, 2, 2},
      {1, 2, 5, 5, 3, 5, 5, 1, 0},  // kernel covers the image: 1x1 output
      {2, 3, 4, 5, 3, 3, 3, 1, 2},  // padding 2 with a 3x3 kernel: corner windows all padding
      {2, 3, 7, 9, 4, 3, 2, 1, 1},  // non-square kernel
      {3, 1, 9, 8, 2, 2, 3, 2, 1},  // one input channel, non-square, strided
      {2, 3, 7, 9, 4, 5, 3, 1, 1},  // OW == W but OH < H: row-shift layout with a tall kernel
      {1, 2, 2, 3, 3, 5, 5, 1, 2},  // image smaller than the kernel: some kernel rows never valid
  };
  return v;
}

struct ConvRef {
  std::vector<double> y, dx, dw, db;
};

// Direct convolution and its gradients in double.
ConvRef naive_conv(const ConvCase& k, const Tensor& x, const Tensor& w, const Tensor* b, const Tensor* dy) {
  const int64_t oh = (k.h + 2 * k.pad - k.kh) / k.stride + 1, ow = (k.w + 2 * k.pad - k.kw) / k.stride + 1;
  ConvRef r{std::vector<double>(k.n * k.oc * oh * ow), std::vector<double>(x.numel()),
            std::vector<double>(w.numel()), std::vector<double>(k.oc)};
  const float *xp = x.f32(), *wp = w.f32();
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.oc; ++o)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t yi = ((n * k.oc + o) * oh + i) * ow + j;
          const double g = dy ? dy->f32()[yi] : 0.0;
          double s = b ? b->f32()[o] : 0.0;
          r.db[o] += g;
          for (int64_t c = 0; c < k.c; ++c)
            for (int64_t a = 0; a < k.kh; ++a)
              for (int64_t e = 0; e < k.kw; ++e) {
                const int64_t ih = i * k.stride - k.pad + a, iw = j * k.stride - k.pad + e;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const int64_t xi = ((n * k.c + c) * k.h + ih) * k.w + iw;
                const int64_t wi = ((o * k.c + c) * k.kh + a) * k.kw + e;
                s += double(xp[xi]) * wp[wi];
                r.dx[xi] += g * wp[wi];
                r.dw[wi] += g * xp[xi];
              }
          r.y[yi] = s;
        }
  return r;
}

double max_abs_diff(const Tensor& t, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(t.f32()[i] - ref[i]);
    if (std::isnan(d)) return 1e30;
    m = std::max(m, d);
  }
  return m;
}

TEST(Conv2d, OutputShape) {
  using kernels::conv2d_output_shape;
  EXPECT_EQ(conv2d_output_shape(Shape{3, 5, 7, 9}, Shape{4, 5, 3, 3}, {1, 1}), (Shape{3, 4, 7, 9}));
  EXPECT_EQ(conv2d_output_shape(Shape{3, 5, 7, 9}, Shape{4, 5, 3, 3}, {2, 1}), (Shape{3, 4, 4, 5}));
  EXPECT_EQ(conv2d_output_shape(Shape{1, 1, 28, 28}, Shape{6, 1, 5, 5}, {1, 0}), (Shape{1, 6, 24, 24}));
  EXPECT_THROW(conv2d_output_shape(Shape{3, 5, 7, 9}, Shape{4, 6, 3, 3}, {1, 1}), Error);   // channels
  EXPECT_THROW(conv2d_output_shape(Shape{3, 5, 2, 9}, Shape{4, 5, 5, 5}, {1, 1}), Error);   // kernel too big
  EXPECT_THROW(conv2d_output_shape(Shape{3, 5, 7, 9}, Shape{4, 5, 3, 3}, {0, 1}), Error);   // stride 0
  EXPECT_THROW(conv2d_output_shape(Shape{5, 7, 9}, Shape{4, 5, 3, 3}, {1, 1}), Error);      // 3-D input
}

class Conv2dOnBackend : public ft::BackendTest {
 protected:
  // Forward and backward against the direct convolution: within 1e-4
  // absolute on CPU, within `cuda_rtol` (relative, cudatest::close) on CUDA.
  // y and dx are poisoned (=); dw and db start from random values (+=); a
  // second backward without dx (cached plan on CUDA) accumulates again.
  void check(const ConvCase& k, bool with_bias, const MathOptions& math, double cuda_rtol, std::mt19937_64& rng) {
    SCOPED_TRACE(::testing::Message() << k << " bias " << with_bias << " deterministic " << math.deterministic
                                      << " benchmark " << math.cudnn_benchmark << " tf32 " << math.allow_tf32);
    ctx().math = math;
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dw0 = ft::random_tensor(w.shape(), rng), db0 = ft::random_tensor(Shape{k.oc}, rng);
    Tensor xd = up(x), wd = up(w), bd = up(b), dyd = up(dy), dwd = up(dw0), dbd = up(db0);
    Tensor yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::conv2d_forward(ctx(), xd, wd, with_bias ? &bd : nullptr, g, yd);
    kernels::conv2d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, &dbd);
    ConvRef r = naive_conv(k, x, w, with_bias ? &b : nullptr, &dy);
    for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += dw0.f32()[i];
    for (int64_t i = 0; i < k.oc; ++i) r.db[i] += db0.f32()[i];
    const Tensor y = down(yd), dx = down(dxd);
    expect_near(y, r.y, cuda_rtol, "y");
    expect_near(dx, r.dx, cuda_rtol, "dx");
    expect_near(down(dwd), r.dw, cuda_rtol, "dw (+=)");
    expect_near(down(dbd), r.db, cuda_rtol, "db (+=)");
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);

    kernels::conv2d_backward(ctx(), xd, wd, dyd, g, nullptr, dwd, &dbd);
    ConvRef r2 = naive_conv(k, x, w, nullptr, &dy);
    for (int64_t i = 0; i < w.numel(); ++i) r.dw[i] += r2.dw[i];
    for (int64_t i = 0; i < k.oc; ++i) r.db[i] += r2.db[i];
    expect_near(down(dwd), r.dw, cuda_rtol, "dw after a second backward without dx");
    expect_near(down(dbd), r.db, cuda_rtol, "db after a second backward");
  }

  void expect_near(const Tensor& got, const std::vector<double>& want, double cuda_rtol, const char* what) {
    EXPECT_TRUE(matches(got, want, 1e-4, cuda_rtol)) << what;
  }
};
FANOUT_ON_EVERY_BACKEND(Conv2dOnBackend);

TEST_P(Conv2dOnBackend, ForwardBackwardAgainstDirectConvolution) {
  std::mt19937_64 rng(51);
  int variant = 0;
  for (const ConvCase& k : cases()) check(k, (variant++ % 2) == 0, {}, 1e-4, rng);
}

TEST_P(Conv2dOnBackend, SquareKernelGridAgainstDirectConvolution) {
  std::mt19937_64 rng(100);
  for (int64_t k : {1, 3, 5})
    for (int64_t stride : {1, 2})
      for (int64_t pad : {0, 1, 2}) {
        check({3, 5, 7, 9, 4, k, k, stride, pad}, true, {}, 1e-4, rng);
        check({2, 3, 9, 7, 6, k, k, stride, pad}, false, {}, 1e-4, rng);
      }
}

TEST_P(Conv2dOnBackend, MathOptionsAgainstDirectConvolution) {
  std::mt19937_64 rng(200);
  MathOptions det;
  det.deterministic = true;
  for (int64_t k : {1, 3, 5}) check({3, 5, 7, 9, 4, k, k, 2, 1}, true, det, 1e-4, rng);
  check({4, 16, 12, 12, 32, 3, 3, 1, 1}, false, det, 1e-3, rng);
  MathOptions bench;
  bench.cudnn_benchmark = true;
  for (int64_t k : {1, 3, 5}) check({3, 5, 7, 9, 4, k, k, 1, 2}, true, bench, 1e-4, rng);
  bench.deterministic = true;
  check({3, 5, 7, 9, 4, 3, 3, 2, 0}, true, bench, 1e-4, rng);
  // K = 64 * 3 * 3 = 576 per output, and N * OH * OW = 1152 per weight gradient.
  check({8, 64, 13, 11, 96, 3, 3, 1, 1}, true, {}, 1e-3, rng);
  check({8, 64, 13, 11, 96, 3, 3, 2, 1}, false, {}, 1e-3, rng);
}

TEST_P(Conv2dOnBackend, Tf32WithinTf32Tolerance) {
  if (!on_cuda()) GTEST_SKIP() << "TF32 is a CUDA math mode; the CPU computes in float32";
  std::mt19937_64 rng(500);
  MathOptions m;
  m.allow_tf32 = true;
  check({4, 32, 10, 10, 48, 3, 3, 1, 1}, true, m, 3e-2, rng);
}

TEST_P(Conv2dOnBackend, GradientsByCentralDifferences) {
  std::mt19937_64 rng(52);
  for (const ConvCase& k : {cases()[0], cases()[1], cases()[5], cases()[8], cases()[10], cases()[12]}) {
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor yd = poisoned(ys);
    auto loss = [&] {
      Tensor xe = up(x), we = up(w), be = up(b);
      kernels::conv2d_forward(ctx(), xe, we, &be, g, yd);
      return ft::dot(down(yd), r);
    };
    Tensor xd = up(x), wd = up(w), rd = up(r), dxd = poisoned(x.shape());
    Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc}));
    kernels::conv2d_backward(ctx(), xd, wd, rd, g, &dxd, dwd, &dbd);
    const Tensor dx = down(dxd), dw = down(dwd), db = down(dbd);
    for (auto [t, gr, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
      auto res = ft::grad_check_detail(loss, *t, *gr);
      EXPECT_LT(res.worst, 1e-2) << k << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << k << " d" << name;
    }
  }
}

TEST_P(Conv2dOnBackend, BackwardTwiceDoublesParameterGradients) {
  std::mt19937_64 rng(53);
  const ConvCase k = cases()[1];
  Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
  Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
  const kernels::Conv2dGeometry g{k.stride, k.pad};
  Tensor dy = ft::random_tensor(kernels::conv2d_output_shape(x.shape(), w.shape(), g), rng);
  Tensor xd = up(x), wd = up(w), dyd = up(dy);
  Tensor dwd = up(Tensor::zeros(w.shape())), dbd = up(Tensor::zeros(Shape{k.oc})), dxd = poisoned(x.shape());
  kernels::conv2d_backward(ctx(), xd, wd, dyd, g, nullptr, dwd, &dbd);
  const Tensor dw1 = down(dwd), db1 = down(dbd);
  kernels::conv2d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, &dbd);
  const Tensor dx1 = down(dxd);
  dxd.copy_from(poisoned(x.shape()));
  kernels::conv2d_backward(ctx(), xd, wd, dyd, g, &dxd, dwd, nullptr);  // dx is written, not accumulated
  const Tensor dw = down(dwd), db = down(dbd), dx = down(dxd);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.f32()[i], 3 * dw1.f32()[i], 1e-4);
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_NEAR(db.f32()[i], 2 * db1.f32()[i], 1e-4);
  // Written, not accumulated: equal up to the order of cuDNN's (possibly atomic) sums.
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_NEAR(dx.f32()[i], dx1.f32()[i], 1e-5 * (1 + std::abs(dx1.f32()[i])));
  EXPECT_GT(ft::l2_norm(dw1), 0.0);
  EXPECT_GT(ft::l2_norm(db1), 0.0);
}

// float64 gradients: the reference's values, and the same bits whether the
// batch is processed whole or in parts, in any order. With them the CPU runs
// every pass image by image, so dx is split-invariant too.
TEST(Conv2d, Float64GradientsDoNotDependOnTheSplit) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(55);
  for (const ConvCase& k0 : {cases()[0], cases()[1], cases()[4], cases()[7]}) {
    ConvCase k = k0;
    k.n = 5;
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
    Tensor dy = ft::random_tensor(ys, rng);
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape(), DType::F64);
    Tensor db = Tensor::zeros(Shape{k.oc}, DType::F64);
    kernels::conv2d_backward(ctx, x, w, dy, g, &dx, dw, &db);
    ConvRef r = naive_conv(k, x, w, nullptr, &dy);
    EXPECT_LT(max_abs_diff(dx, r.dx), 1e-4) << k;
    for (int64_t i = 0; i < dw.numel(); ++i) ASSERT_NEAR(dw.f64()[i], r.dw[i], 1e-4) << k << " dw at " << i;
    for (int64_t i = 0; i < db.numel(); ++i) ASSERT_NEAR(db.f64()[i], r.db[i], 1e-4) << k << " db at " << i;

    Tensor dx2 = Tensor::empty(x.shape()), dw2 = Tensor::zeros(w.shape(), DType::F64);
    Tensor db2 = Tensor::zeros(Shape{k.oc}, DType::F64);
    for (auto [lo, hi] : {std::pair<int64_t, int64_t>{3, 5}, {0, 1}, {1, 3}}) {
      Tensor dxs = dx2.slice(lo, hi);
      kernels::conv2d_backward(ctx, x.slice(lo, hi), w, dy.slice(lo, hi), g, &dxs, dw2, &db2);
    }
    EXPECT_TRUE(ft::same_bits(dw2, dw)) << k;
    EXPECT_TRUE(ft::same_bits(db2, db)) << k;
    EXPECT_TRUE(ft::same_bits(dx2, dx)) << k;
    EXPECT_GT(ft::l2_norm(dx), 0.0) << k;
  }
}

TEST(Conv2d, WorkspaceGrowsAcrossCalls) {
  // A small conv then a larger one on the same context, then the small one again.
  Context ctx(Device::cpu());
  std::mt19937_64 rng(54);
  for (const ConvCase& k : {cases()[2], cases()[8], cases()[2]}) {
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    Tensor y = Tensor::empty(kernels::conv2d_output_shape(x.shape(), w.shape(), g));
    ft::poison(y);
    kernels::conv2d_forward(ctx, x, w, nullptr, g, y);
    EXPECT_LT(max_abs_diff(y, naive_conv(k, x, w, nullptr, nullptr).y), 1e-4) << k;
  }
  EXPECT_GT(ctx.workspace_size(), 0u);
}

TEST_P(Conv2dOnBackend, ShapeMismatchesThrow) {
  Context& ctx = this->ctx();
  const kernels::Conv2dGeometry g{1, 1};
  Tensor x = up(Tensor::zeros(Shape{3, 5, 7, 9})), w = up(Tensor::zeros(Shape{4, 5, 3, 3}));
  Tensor y = up(Tensor::zeros(Shape{3, 4, 7, 9}));
  Tensor w_bad = up(Tensor::zeros(Shape{4, 6, 3, 3})), y_bad = up(Tensor::zeros(Shape{3, 4, 7, 8}));
  Tensor b_bad = up(Tensor::zeros(Shape{5}));
  EXPECT_NO_THROW(kernels::conv2d_forward(ctx, x, w, nullptr, g, y));
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w_bad, nullptr, g, y), Error);
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w, nullptr, g, y_bad), Error);
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w, &b_bad, g, y), Error);
  Tensor dw_bad = up(Tensor::zeros(Shape{4, 5, 3, 2})), dw = up(Tensor::zeros(w.shape()));
  Tensor dx_bad = up(Tensor::zeros(Shape{3, 5, 7, 8}));
  EXPECT_THROW(kernels::conv2d_backward(ctx, x, w, y, g, nullptr, dw_bad, nullptr), Error);
  EXPECT_THROW(kernels::conv2d_backward(ctx, x, w, y, g, &dx_bad, dw, nullptr), Error);
  EXPECT_THROW(kernels::conv2d_backward(ctx, x, w, y_bad, g, nullptr, dw, nullptr), Error);
  try {
    kernels::conv2d_forward(ctx, x, w, nullptr, g, y_bad);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_forward"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3, 4, 7, 8)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3, 5, 7, 9)"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fanout
