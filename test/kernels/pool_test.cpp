// Max / average / global-average pooling on every backend against naive
// references over several geometries: argmax and first-max-wins ties (also
// with CUDA's deterministic mode), padding never selected by max pooling,
// count_include_pad averaging, central-difference gradients (overlapping
// windows accumulate), and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/pool.h"
#include "runtime/core/error.h"

namespace fanout {
namespace kernels {
std::ostream& operator<<(std::ostream& os, const PoolGeometry& g) {
  return os << "k" << g.kernel << " s" << g.stride << " p" << g.padding;
}
}  // namespace kernels

namespace {

namespace ft = fanout::testing;
using kernels::PoolGeometry;

const std::vector<PoolGeometry> kGeoms = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0},
                                          {3, 3, 0}, {5, 2, 2}, {1, 1, 0}, {4, 3, 2}};
const Shape kShape{3, 5, 7, 9};

// Naive max pooling: scans every kernel offset, skips positions outside the
// image, keeps the first strict maximum.
void naive_maxpool(const Tensor& x, const PoolGeometry& g, std::vector<float>& y, std::vector<int32_t>& arg) {
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * g.padding - g.kernel) / g.stride + 1, ow = (w + 2 * g.padding - g.kernel) / g.stride + 1;
  y.assign(planes * oh * ow, 0.0f);
  arg.assign(planes * oh * ow, -1);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        bool any = false;
        float best = 0;
        int32_t bi = -1;
        for (int64_t a = 0; a < g.kernel; ++a)
          for (int64_t b = 0; b < g.kernel; ++b) {
            const int64_t r = i * g.stride - g.padding + a, c = j * g.stride - g.padding + b;
            if (r < 0 || r >= h || c < 0 || c >= w) continue;
            const float v = x.f32()[p * h * w + r * w + c];
            if (!any || v > best) {
              any = true;
              best = v;
              bi = static_cast<int32_t>(r * w + c);
            }
          }
        y[(p * oh + i) * ow + j] = best;
        arg[(p * oh + i) * ow + j] = bi;
      }
}

// Naive average pooling with count_include_pad (divisor kernel^2), in double.
std::vector<double> naive_avgpool(const Tensor& x, const PoolGeometry& g) {
  const int64_t planes = x.size(0) * x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * g.padding - g.kernel) / g.stride + 1, ow = (w + 2 * g.padding - g.kernel) / g.stride + 1;
  std::vector<double> y(planes * oh * ow);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double s = 0;
        for (int64_t a = 0; a < g.kernel; ++a)
          for (int64_t b = 0; b < g.kernel; ++b) {
            const int64_t r = i * g.stride - g.padding + a, c = j * g.stride - g.padding + b;
            if (r >= 0 && r < h && c >= 0 && c < w) s += x.f32()[p * h * w + r * w + c];
          }
        y[(p * oh + i) * ow + j] = s / static_cast<double>(g.kernel * g.kernel);
      }
  return y;
}

TEST(Pool, OutputShape) {
  EXPECT_EQ(kernels::pool2d_output_shape(Shape{3, 5, 7, 9}, {2, 2, 0}), (Shape{3, 5, 3, 4}));
  EXPECT_EQ(kernels::pool2d_output_shape(Shape{3, 5, 7, 9}, {3, 2, 1}), (Shape{3, 5, 4, 5}));
  EXPECT_EQ(kernels::pool2d_output_shape(Shape{1, 1, 28, 28}, {2, 2, 0}), (Shape{1, 1, 14, 14}));
  EXPECT_THROW(kernels::pool2d_output_shape(Shape{3, 5, 7, 9}, {3, 2, 2}), Error);  // padding > kernel / 2
  EXPECT_THROW(kernels::pool2d_output_shape(Shape{3, 5, 2, 9}, {4, 1, 0}), Error);  // kernel > input
  EXPECT_THROW(kernels::pool2d_output_shape(Shape{3, 5, 7, 9}, {2, 0, 0}), Error);  // stride 0
}

class MaxPool : public ft::BackendTest {};
class AvgPool : public ft::BackendTest {};
class GlobalAvgPool : public ft::BackendTest {};
class PoolErrors : public ft::BackendTest {};
FANOUT_ON_EVERY_BACKEND(MaxPool);
FANOUT_ON_EVERY_BACKEND(AvgPool);
FANOUT_ON_EVERY_BACKEND(GlobalAvgPool);
FANOUT_ON_EVERY_BACKEND(PoolErrors);

// Inputs rounded to a few values, so windows hold ties (first maximum wins).
Tensor tied_tensor(const Shape& s, std::mt19937_64& rng) {
  Tensor t = ft::random_tensor(s, rng);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::round(t.f32()[i] * 2.0f) / 2.0f;
  return t;
}

TEST_P(MaxPool, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(71);
  struct Case {
    Shape x;
    PoolGeometry g;
    bool ties, deterministic;
  };
  std::vector<Case> cases;
  for (const PoolGeometry& g : kGeoms)
    for (bool ties : {false, true})
      for (bool det : {false, true}) cases.push_back({kShape, g, ties, det});
  cases.push_back({Shape{4, 64, 32, 32}, {3, 2, 1}, false, false});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.x.str() << " " << c.g << " ties " << c.ties << " deterministic "
                                      << c.deterministic);
    ctx().math.deterministic = c.deterministic;
    Tensor x = c.ties ? tied_tensor(c.x, rng) : ft::random_tensor(c.x, rng);
    const Shape ys = kernels::pool2d_output_shape(x.shape(), c.g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
    kernels::maxpool2d_forward(ctx(), xd, c.g, yd, argd);
    kernels::maxpool2d_backward(ctx(), rd, argd, dxd);
    const Tensor y = down(yd), arg = down(argd), dx = down(dxd);
    std::vector<float> ry;
    std::vector<int32_t> ra;
    naive_maxpool(x, c.g, ry, ra);
    for (int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_EQ(y.f32()[i], ry[i]) << i;
      ASSERT_EQ(arg.data<int32_t>()[i], ra[i]) << i;
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    // Backward: scatter-add dy through the naive argmax (overlapping windows accumulate).
    std::vector<double> ref(x.numel(), 0.0);
    const int64_t hw = c.x[2] * c.x[3], ohw = ys[2] * ys[3];
    for (int64_t i = 0; i < r.numel(); ++i) ref[(i / ohw) * hw + ra[i]] += r.f32()[i];
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(dx.f32()[i], ref[i], 1e-5) << i;
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST_P(MaxPool, TiesPickFirstAndPaddingIsNeverSelected) {
  // All-equal negative input: padding (which would read as 0 if it were
  // selectable) must lose, and the first position of each clipped window wins.
  Tensor x = Tensor::empty(Shape{1, 2, 5, 6});
  x.fill(-3.0f);
  const PoolGeometry g{3, 2, 1};
  const Shape ys = kernels::pool2d_output_shape(x.shape(), g);
  Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
  kernels::maxpool2d_forward(ctx(), xd, g, yd, argd);
  const Tensor y = down(yd), arg = down(argd);
  for (int64_t i = 0; i < ys[2]; ++i)
    for (int64_t j = 0; j < ys[3]; ++j) {
      const int64_t r0 = std::max<int64_t>(0, i * 2 - 1), c0 = std::max<int64_t>(0, j * 2 - 1);
      EXPECT_EQ(y.f32()[i * ys[3] + j], -3.0f);
      EXPECT_EQ(arg.data<int32_t>()[i * ys[3] + j], r0 * 6 + c0);
    }
  // A repeated maximum inside one window: the first in row-major order wins.
  Tensor z = Tensor::zeros(Shape{1, 1, 2, 2});
  z.f32()[1] = 5.0f;
  z.f32()[3] = 5.0f;
  Tensor zd = up(z), zyd = poisoned(Shape{1, 1, 1, 1}), zad = poisoned(Shape{1, 1, 1, 1}, DType::I32);
  kernels::maxpool2d_forward(ctx(), zd, {2, 2, 0}, zyd, zad);
  EXPECT_EQ(down(zyd).f32()[0], 5.0f);
  EXPECT_EQ(down(zad).data<int32_t>()[0], 1);
}

TEST_P(MaxPool, NanPropagates) {
  // As PyTorch's kernels: a NaN in a window is the maximum (and its argmax), on both code paths.
  std::mt19937_64 rng(75);
  for (const PoolGeometry& g : {PoolGeometry{2, 2, 0}, PoolGeometry{3, 2, 1}}) {
    Tensor x = ft::random_tensor(Shape{1, 1, 6, 6}, rng);
    x.f32()[1 * 6 + 1] = std::numeric_limits<float>::quiet_NaN();  // inside output (0, 0)'s window for both
    const Shape ys = kernels::pool2d_output_shape(x.shape(), g);
    Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
    kernels::maxpool2d_forward(ctx(), xd, g, yd, argd);
    const Tensor y = down(yd), arg = down(argd);
    EXPECT_TRUE(std::isnan(y.f32()[0])) << g;
    EXPECT_EQ(arg.data<int32_t>()[0], 7) << g;
    EXPECT_FALSE(std::isnan(y.f32()[ys.numel() - 1])) << g;
  }
}

TEST_P(MaxPool, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(72);
  for (const PoolGeometry& g : kGeoms) {
    Tensor x = ft::random_tensor(kShape, rng);
    const Shape ys = kernels::pool2d_output_shape(x.shape(), g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
    kernels::maxpool2d_forward(ctx(), xd, g, yd, argd);
    kernels::maxpool2d_backward(ctx(), rd, argd, dxd);
    const Tensor dx = down(dxd);
    auto loss = [&] {
      Tensor xe = up(x);
      kernels::maxpool2d_forward(ctx(), xe, g, yd, argd);
      return ft::dot(down(yd), r);
    };
    auto res = ft::grad_check_detail(loss, x, dx, 1e-3);
    EXPECT_LT(res.worst, 1e-2) << g;
    EXPECT_GT(res.checked, 150) << g;
  }
}

TEST_P(AvgPool, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(73);
  std::vector<PoolGeometry> geoms = kGeoms;
  geoms.push_back({4, 4, 2});
  for (const PoolGeometry& g : geoms) {
    SCOPED_TRACE(::testing::Message() << g);
    Tensor x = ft::random_tensor(kShape, rng);
    const Shape ys = kernels::pool2d_output_shape(x.shape(), g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::avgpool2d_forward(ctx(), xd, g, yd);
    kernels::avgpool2d_backward(ctx(), rd, g, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    const std::vector<double> ref = naive_avgpool(x, g);
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.f32()[i], ref[i], tol(1e-6, 1e-5)) << i;
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);
    auto loss = [&] {
      Tensor xe = up(x);
      kernels::avgpool2d_forward(ctx(), xe, g, yd);
      return ft::dot(down(yd), r);
    };
    auto res = ft::grad_check_detail(loss, x, dx);
    EXPECT_LT(res.worst, 1e-2);
    EXPECT_GT(res.checked, 150);
  }
}

TEST_P(GlobalAvgPool, ForwardBackward) {
  std::mt19937_64 rng(74);
  for (const Shape& s :
       {Shape{3, 5, 7, 9}, Shape{2, 3, 1, 1}, Shape{2, 4, 1, 13}, Shape{2, 513, 1, 1}, Shape{2, 3, 45, 47}}) {
    SCOPED_TRACE(s.str());
    Tensor x = ft::random_tensor(s, rng);
    const Shape ys{s[0], s[1], 1, 1};
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), dxd = poisoned(s);
    kernels::global_avgpool_forward(ctx(), xd, yd);
    kernels::global_avgpool_backward(ctx(), rd, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    const int64_t hw = s[2] * s[3];
    for (int64_t p = 0; p < s[0] * s[1]; ++p) {
      double m = 0;
      for (int64_t k = 0; k < hw; ++k) m += x.f32()[p * hw + k];
      ASSERT_NEAR(y.f32()[p], m / hw, tol(1e-6, 1e-5)) << p;
      for (int64_t k = 0; k < hw; ++k) ASSERT_NEAR(dx.f32()[p * hw + k], r.f32()[p] / hw, 1e-6) << p << " " << k;
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);
    if (x.numel() > 2000) continue;  // central differences on the small shapes
    auto loss = [&] {
      Tensor xe = up(x);
      kernels::global_avgpool_forward(ctx(), xe, yd);
      return ft::dot(down(yd), r);
    };
    auto res = ft::grad_check_detail(loss, x, dx);
    EXPECT_LT(res.worst, 1e-2);
    EXPECT_EQ(res.skipped, 0);
  }
}

TEST_P(PoolErrors, Throw) {
  Tensor x = up(Tensor::zeros(Shape{3, 5, 7, 9}));
  Tensor y = up(Tensor::zeros(Shape{3, 5, 3, 4})), arg = up(Tensor::zeros(Shape{3, 5, 3, 4}, DType::I32));
  Tensor y_bad = up(Tensor::zeros(Shape{3, 5, 4, 4})), arg_f32 = up(Tensor::zeros(Shape{3, 5, 3, 4}));
  EXPECT_NO_THROW(kernels::maxpool2d_forward(ctx(), x, {2, 2, 0}, y, arg));
  EXPECT_THROW(kernels::maxpool2d_forward(ctx(), x, {2, 2, 0}, y_bad, arg), Error);
  EXPECT_THROW(kernels::maxpool2d_forward(ctx(), x, {2, 2, 0}, y, arg_f32), Error);
  EXPECT_THROW(kernels::maxpool2d_forward(ctx(), x, {2, 2, 2}, y, arg), Error);
  Tensor dx_bad = up(Tensor::zeros(Shape{3, 4, 7, 9}));
  EXPECT_THROW(kernels::maxpool2d_backward(ctx(), y, arg, dx_bad), Error);
  EXPECT_THROW(kernels::maxpool2d_backward(ctx(), y_bad, arg, x), Error);
  EXPECT_THROW(kernels::avgpool2d_forward(ctx(), x, {2, 2, 0}, y_bad), Error);
  EXPECT_THROW(kernels::avgpool2d_backward(ctx(), y_bad, {2, 2, 0}, x), Error);
  Tensor g_bad = up(Tensor::zeros(Shape{3, 5, 1, 2}));
  EXPECT_THROW(kernels::global_avgpool_forward(ctx(), x, g_bad), Error);
  EXPECT_THROW(kernels::global_avgpool_backward(ctx(), g_bad, x), Error);
}

TEST(Pool, ArgmaxOutsideThePlaneIsRefused) {
  // Checked on the host before writing (CPU): never written out of bounds.
  Context ctx(Device::cpu());
  Tensor x = Tensor::zeros(Shape{3, 5, 7, 9});
  Tensor y = Tensor::zeros(Shape{3, 5, 3, 4}), arg = Tensor::zeros(Shape{3, 5, 3, 4}, DType::I32);
  arg.data<int32_t>()[0] = 63;
  EXPECT_THROW(kernels::maxpool2d_backward(ctx, y, arg, x), Error);
}

}  // namespace
}  // namespace fanout
