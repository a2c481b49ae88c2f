// 2-D convolution (im2col + GEMM on CPU) against a direct double-precision
// convolution, forward and backward, over many geometries (stride 1/2,
// padding 0/1/2, kernel 1/3/5, non-square kernels, windows entirely in the
// padding); central-difference gradient checks; += semantics; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/conv2d.h"
#include "runtime/core/error.h"
#include "support/test_util.h"

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
      {2, 3, 8, 6, 5, 1, 1, 1, 0},  // 1x1 direct path (no im2col)
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

TEST(Conv2d, ForwardBackwardAgainstDirectConvolution) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(51);
  int variant = 0;
  for (const ConvCase& k : cases()) {
    const bool with_bias = (variant++ % 2) == 0;
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
    Tensor y = Tensor::empty(ys), dy = ft::random_tensor(ys, rng), dx = Tensor::empty(x.shape());
    ft::poison(y);
    ft::poison(dx);
    Tensor dw0 = ft::random_tensor(w.shape(), rng), db0 = ft::random_tensor(Shape{k.oc}, rng);
    Tensor dw = ft::clone(dw0), db = ft::clone(db0);
    kernels::conv2d_forward(ctx, x, w, with_bias ? &b : nullptr, g, y);
    kernels::conv2d_backward(ctx, x, w, dy, g, &dx, dw, &db);
    ConvRef r = naive_conv(k, x, w, with_bias ? &b : nullptr, &dy);
    for (int64_t i = 0; i < dw.numel(); ++i) r.dw[i] += dw0.f32()[i];
    for (int64_t i = 0; i < db.numel(); ++i) r.db[i] += db0.f32()[i];
    EXPECT_LT(max_abs_diff(y, r.y), 1e-4) << k;
    EXPECT_LT(max_abs_diff(dx, r.dx), 1e-4) << k;
    EXPECT_LT(max_abs_diff(dw, r.dw), 1e-4) << k;
    EXPECT_LT(max_abs_diff(db, r.db), 1e-4) << k;
    EXPECT_GT(ft::l2_norm(y), 0.0) << k;
    EXPECT_GT(ft::l2_norm(dx), 0.0) << k;
  }
}

TEST(Conv2d, GradientsByCentralDifferences) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(52);
  for (const ConvCase& k : {cases()[0], cases()[1], cases()[5], cases()[8], cases()[10], cases()[12]}) {
    Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
    Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
    Tensor b = ft::random_tensor(Shape{k.oc}, rng);
    const kernels::Conv2dGeometry g{k.stride, k.pad};
    const Shape ys = kernels::conv2d_output_shape(x.shape(), w.shape(), g);
    Tensor y = Tensor::empty(ys), r = ft::random_tensor(ys, rng);
    auto loss = [&] {
      kernels::conv2d_forward(ctx, x, w, &b, g, y);
      return ft::dot(y, r);
    };
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::zeros(w.shape()), db = Tensor::zeros(Shape{k.oc});
    ft::poison(dx);
    kernels::conv2d_backward(ctx, x, w, r, g, &dx, dw, &db);
    for (auto [t, gr, name] : {std::tuple{&x, &dx, "x"}, std::tuple{&w, &dw, "w"}, std::tuple{&b, &db, "b"}}) {
      auto res = ft::grad_check_detail(loss, *t, *gr);
      EXPECT_LT(res.worst, 1e-2) << k << " d" << name;
      EXPECT_GE(res.checked, std::min<int>(100, static_cast<int>(t->numel()))) << k << " d" << name;
    }
  }
}

TEST(Conv2d, BackwardTwiceDoublesParameterGradients) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(53);
  const ConvCase k = cases()[1];
  Tensor x = ft::random_tensor(Shape{k.n, k.c, k.h, k.w}, rng);
  Tensor w = ft::random_tensor(Shape{k.oc, k.c, k.kh, k.kw}, rng);
  const kernels::Conv2dGeometry g{k.stride, k.pad};
  Tensor dy = ft::random_tensor(kernels::conv2d_output_shape(x.shape(), w.shape(), g), rng);
  Tensor dw = Tensor::zeros(w.shape()), db = Tensor::zeros(Shape{k.oc}), dx = Tensor::empty(x.shape());
  kernels::conv2d_backward(ctx, x, w, dy, g, nullptr, dw, &db);
  Tensor dw1 = ft::clone(dw), db1 = ft::clone(db);
  ft::poison(dx);
  kernels::conv2d_backward(ctx, x, w, dy, g, &dx, dw, &db);
  Tensor dx1 = ft::clone(dx);
  ft::poison(dx);
  kernels::conv2d_backward(ctx, x, w, dy, g, &dx, dw, nullptr);  // dx is written, not accumulated
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw.f32()[i], 3 * dw1.f32()[i], 1e-4);
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_NEAR(db.f32()[i], 2 * db1.f32()[i], 1e-4);
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(dx.f32()[i], dx1.f32()[i]);
  EXPECT_GT(ft::l2_norm(dw1), 0.0);
  EXPECT_GT(ft::l2_norm(db1), 0.0);
}

// float64 gradients: the reference's values, and the same bits whether the
// batch is processed whole or in parts, in any order. y and dx are computed
// image by image, so they are split-invariant with either gradient dtype.
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

TEST(Conv2d, ShapeMismatchesThrow) {
  Context ctx(Device::cpu());
  const kernels::Conv2dGeometry g{1, 1};
  Tensor x = Tensor::zeros(Shape{3, 5, 7, 9}), w = Tensor::zeros(Shape{4, 5, 3, 3});
  Tensor y = Tensor::zeros(Shape{3, 4, 7, 9});
  Tensor w_bad = Tensor::zeros(Shape{4, 6, 3, 3}), y_bad = Tensor::zeros(Shape{3, 4, 7, 8});
  Tensor b_bad = Tensor::zeros(Shape{5});
  EXPECT_NO_THROW(kernels::conv2d_forward(ctx, x, w, nullptr, g, y));
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w_bad, nullptr, g, y), Error);
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w, nullptr, g, y_bad), Error);
  EXPECT_THROW(kernels::conv2d_forward(ctx, x, w, &b_bad, g, y), Error);
  Tensor dw_bad = Tensor::zeros(Shape{4, 5, 3, 2}), dw = Tensor::zeros(w.shape());
  Tensor dx_bad = Tensor::zeros(Shape{3, 5, 7, 8});
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
