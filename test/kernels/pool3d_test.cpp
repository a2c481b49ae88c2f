// Volumetric max and average pooling and nearest upsampling on every
// backend against naive references (average: float64 window sums over
// kernel^3, torch's count_include_pad, and the gradient spread back over
// each window; central differences): argmax with first-max-wins ties (also with CUDA's
// deterministic backward), padding never selected, NaN propagation, volumes
// with D != H != W, stride 2, padding; the upsampled gradient summing its
// s^3 copies; central-difference gradients; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/pool3d.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;
using kernels::PoolGeometry;

// pool_test.cpp, in the same executable, defines operator<< for PoolGeometry.
std::string str(const PoolGeometry& g) {
  return "k" + std::to_string(g.kernel) + " s" + std::to_string(g.stride) + " p" + std::to_string(g.padding);
}

const std::vector<PoolGeometry> kGeoms = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {3, 3, 0}, {1, 1, 0}, {4, 3, 2}};
const Shape kShape{2, 3, 5, 7, 6};

// Naive max pooling: scans every kernel offset, skips positions outside the
// volume, keeps the first strict maximum.
void naive_maxpool3d(const Tensor& x, const PoolGeometry& g, std::vector<float>& y, std::vector<int32_t>& arg) {
  const int64_t vols = x.size(0) * x.size(1), d = x.size(2), h = x.size(3), w = x.size(4);
  const auto out = [&](int64_t len) { return (len + 2 * g.padding - g.kernel) / g.stride + 1; };
  const int64_t od = out(d), oh = out(h), ow = out(w);
  y.assign(vols * od * oh * ow, 0.0f);
  arg.assign(vols * od * oh * ow, -1);
  for (int64_t v = 0; v < vols; ++v)
    for (int64_t i = 0; i < od; ++i)
      for (int64_t j = 0; j < oh; ++j)
        for (int64_t l = 0; l < ow; ++l) {
          bool any = false;
          float best = 0;
          int32_t bi = -1;
          for (int64_t a = 0; a < g.kernel; ++a)
            for (int64_t b = 0; b < g.kernel; ++b)
              for (int64_t c = 0; c < g.kernel; ++c) {
                const int64_t p = i * g.stride - g.padding + a, q = j * g.stride - g.padding + b,
                              r = l * g.stride - g.padding + c;
                if (p < 0 || p >= d || q < 0 || q >= h || r < 0 || r >= w) continue;
                const float val = x.f32()[v * d * h * w + (p * h + q) * w + r];
                if (!any || val > best) {
                  any = true;
                  best = val;
                  bi = static_cast<int32_t>((p * h + q) * w + r);
                }
              }
          const int64_t o = ((v * od + i) * oh + j) * ow + l;
          y[o] = best;
          arg[o] = bi;
        }
}

// Naive nearest upsampling: y at (i, j, l) reads x at (i / s, j / s, l / s);
// the gradient of x sums dy over every output reading it (float64).
std::vector<double> naive_upsample3d(const Tensor& x, int64_t s) {
  const int64_t vols = x.size(0) * x.size(1), d = x.size(2), h = x.size(3), w = x.size(4);
  std::vector<double> y(vols * d * h * w * s * s * s);
  for (int64_t v = 0; v < vols; ++v)
    for (int64_t i = 0; i < d * s; ++i)
      for (int64_t j = 0; j < h * s; ++j)
        for (int64_t l = 0; l < w * s; ++l)
          y[((v * d * s + i) * h * s + j) * w * s + l] = x.f32()[((v * d + i / s) * h + j / s) * w + l / s];
  return y;
}
std::vector<double> naive_upsample3d_grad(const Tensor& dy, const Shape& xs, int64_t s) {
  const int64_t vols = xs[0] * xs[1], d = xs[2], h = xs[3], w = xs[4];
  std::vector<double> dx(xs.numel(), 0.0);
  for (int64_t v = 0; v < vols; ++v)
    for (int64_t i = 0; i < d * s; ++i)
      for (int64_t j = 0; j < h * s; ++j)
        for (int64_t l = 0; l < w * s; ++l)
          dx[((v * d + i / s) * h + j / s) * w + l / s] += dy.f32()[((v * d * s + i) * h * s + j) * w * s + l];
  return dx;
}

TEST(Pool3d, OutputShapes) {
  EXPECT_EQ(kernels::pool3d_output_shape(Shape{2, 3, 5, 7, 6}, {2, 2, 0}), (Shape{2, 3, 2, 3, 3}));
  EXPECT_EQ(kernels::pool3d_output_shape(Shape{2, 3, 5, 7, 6}, {3, 2, 1}), (Shape{2, 3, 3, 4, 3}));
  EXPECT_EQ(kernels::pool3d_output_shape(Shape{1, 1, 32, 64, 48}, {2, 2, 0}), (Shape{1, 1, 16, 32, 24}));
  EXPECT_THROW(kernels::pool3d_output_shape(Shape{2, 3, 5, 7, 6}, {3, 2, 2}), Error);  // padding > kernel / 2
  EXPECT_THROW(kernels::pool3d_output_shape(Shape{2, 3, 5, 2, 6}, {4, 1, 0}), Error);  // kernel > input
  EXPECT_THROW(kernels::pool3d_output_shape(Shape{2, 3, 5, 7, 6}, {2, 0, 0}), Error);  // stride 0
  EXPECT_THROW(kernels::pool3d_output_shape(Shape{2, 3, 7, 6}, {2, 2, 0}), Error);     // 4-D
  EXPECT_EQ(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 2), (Shape{2, 3, 10, 14, 12}));
  EXPECT_EQ(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 1), (Shape{2, 3, 5, 7, 6}));
  EXPECT_THROW(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 0), Error);
  EXPECT_THROW(kernels::upsample3d_output_shape(Shape{2, 3, 7, 6}, 2), Error);
}

class MaxPool3dOnBackend : public ft::BackendTest {};
class Upsample3dOnBackend : public ft::BackendTest {};
class AvgPool3dOnBackend : public ft::BackendTest {};
FANOUT_ON_EVERY_BACKEND(AvgPool3dOnBackend);
class Pool3dErrorsOnBackend : public ft::BackendTest {};
FANOUT_ON_EVERY_BACKEND(MaxPool3dOnBackend);
FANOUT_ON_EVERY_BACKEND(Upsample3dOnBackend);
FANOUT_ON_EVERY_BACKEND(Pool3dErrorsOnBackend);

// Inputs rounded to a few values, so windows hold ties (first maximum wins).
Tensor tied_tensor(const Shape& s, std::mt19937_64& rng) {
  Tensor t = ft::random_tensor(s, rng);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::round(t.f32()[i] * 2.0f) / 2.0f;
  return t;
}

TEST_P(MaxPool3dOnBackend, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(401);
  struct Case {
    Shape x;
    PoolGeometry g;
    bool ties, deterministic;
  };
  std::vector<Case> cases;
  for (const PoolGeometry& g : kGeoms)
    for (bool ties : {false, true})
      for (bool det : {false, true}) cases.push_back({kShape, g, ties, det});
  cases.push_back({Shape{2, 8, 9, 16, 13}, {3, 2, 1}, false, false});
  cases.push_back({Shape{1, 2, 3, 11, 4}, {3, 2, 1}, true, true});
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.x.str() << " " << str(c.g) << " ties " << c.ties << " deterministic "
                                      << c.deterministic);
    ctx().math.deterministic = c.deterministic;
    Tensor x = c.ties ? tied_tensor(c.x, rng) : ft::random_tensor(c.x, rng);
    const Shape ys = kernels::pool3d_output_shape(x.shape(), c.g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
    kernels::maxpool3d_forward(ctx(), xd, c.g, yd, argd);
    kernels::maxpool3d_backward(ctx(), rd, argd, dxd);
    const Tensor y = down(yd), arg = down(argd), dx = down(dxd);
    std::vector<float> ry;
    std::vector<int32_t> ra;
    naive_maxpool3d(x, c.g, ry, ra);
    ASSERT_EQ(y.numel(), static_cast<int64_t>(ry.size()));
    for (int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_EQ(y.f32()[i], ry[i]) << i;
      ASSERT_EQ(arg.data<int32_t>()[i], ra[i]) << i;
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    // Backward: scatter-add dy through the naive argmax (overlapping windows accumulate).
    std::vector<double> ref(x.numel(), 0.0);
    const int64_t dhw = c.x[2] * c.x[3] * c.x[4], odhw = ys[2] * ys[3] * ys[4];
    for (int64_t i = 0; i < r.numel(); ++i) ref[(i / odhw) * dhw + ra[i]] += r.f32()[i];
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(dx.f32()[i], ref[i], 1e-5) << i;
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST_P(MaxPool3dOnBackend, TiesPickFirstAndPaddingIsNeverSelected) {
  // All-equal negative input: padding (0 if it were selectable) must lose,
  // and the first position of each clipped window wins.
  const Shape xs{1, 2, 4, 5, 6};
  Tensor x = Tensor::empty(xs);
  x.fill(-3.0f);
  const PoolGeometry g{3, 2, 1};
  const Shape ys = kernels::pool3d_output_shape(x.shape(), g);
  Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
  kernels::maxpool3d_forward(ctx(), xd, g, yd, argd);
  const Tensor y = down(yd), arg = down(argd);
  for (int64_t v = 0; v < 2; ++v)
    for (int64_t i = 0; i < ys[2]; ++i)
      for (int64_t j = 0; j < ys[3]; ++j)
        for (int64_t l = 0; l < ys[4]; ++l) {
          const int64_t p0 = std::max<int64_t>(0, i * 2 - 1), q0 = std::max<int64_t>(0, j * 2 - 1),
                        r0 = std::max<int64_t>(0, l * 2 - 1);
          const int64_t o = ((v * ys[2] + i) * ys[3] + j) * ys[4] + l;
          EXPECT_EQ(y.f32()[o], -3.0f);
          EXPECT_EQ(arg.data<int32_t>()[o], (p0 * 5 + q0) * 6 + r0);
        }
  // A repeated maximum inside one window: the first in (d, h, w) order wins.
  Tensor z = Tensor::zeros(Shape{1, 1, 2, 2, 2});
  z.f32()[3] = 5.0f;  // (0, 1, 1)
  z.f32()[5] = 5.0f;  // (1, 0, 1)
  const Shape one{1, 1, 1, 1, 1};
  Tensor zd = up(z), zyd = poisoned(one), zad = poisoned(one, DType::I32);
  kernels::maxpool3d_forward(ctx(), zd, {2, 2, 0}, zyd, zad);
  EXPECT_EQ(down(zyd).f32()[0], 5.0f);
  EXPECT_EQ(down(zad).data<int32_t>()[0], 3);
}

TEST_P(MaxPool3dOnBackend, NanPropagates) {
  std::mt19937_64 rng(402);
  for (const PoolGeometry& g : {PoolGeometry{2, 2, 0}, PoolGeometry{3, 2, 1}}) {
    Tensor x = ft::random_tensor(Shape{1, 1, 4, 6, 5}, rng);
    const int64_t nan_at = (1 * 6 + 1) * 5 + 1;  // (1, 1, 1): inside output (0, 0, 0)'s window for both
    x.f32()[nan_at] = std::numeric_limits<float>::quiet_NaN();
    const Shape ys = kernels::pool3d_output_shape(x.shape(), g);
    Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
    kernels::maxpool3d_forward(ctx(), xd, g, yd, argd);
    const Tensor y = down(yd), arg = down(argd);
    EXPECT_TRUE(std::isnan(y.f32()[0])) << str(g);
    EXPECT_EQ(arg.data<int32_t>()[0], nan_at) << str(g);
    EXPECT_FALSE(std::isnan(y.f32()[ys.numel() - 1])) << str(g);
  }
}

TEST_P(MaxPool3dOnBackend, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(403);
  for (const PoolGeometry& g : kGeoms) {
    Tensor x = ft::random_tensor(kShape, rng);
    const Shape ys = kernels::pool3d_output_shape(x.shape(), g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
    kernels::maxpool3d_forward(ctx(), xd, g, yd, argd);
    kernels::maxpool3d_backward(ctx(), rd, argd, dxd);
    const Tensor dx = down(dxd);
    auto loss = [&] {  // <r, y>, accumulated in float64
      Tensor xe = up(x);
      kernels::maxpool3d_forward(ctx(), xe, g, yd, argd);
      return ft::dot(down(yd), r);
    };
    // A small step: random inputs are rarely closer than 1e-3, so few entries are kinks.
    auto res = ft::grad_check_detail(loss, x, dx, 1e-3);
    EXPECT_LT(res.worst, 1e-2) << str(g);
    EXPECT_GT(res.checked, 150) << str(g);
  }
}

TEST_P(AvgPool3dOnBackend, ForwardBackwardAgainstFloat64) {
  std::mt19937_64 rng(406);
  std::vector<std::pair<Shape, PoolGeometry>> cases;
  for (const PoolGeometry& g : kGeoms) cases.emplace_back(kShape, g);
  cases.emplace_back(Shape{1, 2, 9, 16, 13}, PoolGeometry{3, 2, 1});
  for (const auto& [xs, g] : cases) {
    SCOPED_TRACE(xs.str() + " " + str(g));
    Tensor x = ft::random_tensor(xs, rng);
    const Shape ys = kernels::pool3d_output_shape(xs, g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor yd = poisoned(ys), dxd = poisoned(xs);
    kernels::avgpool3d_forward(ctx(), up(x), g, yd);
    kernels::avgpool3d_backward(ctx(), up(r), g, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    const int64_t d = xs[2], h = xs[3], w = xs[4], od = ys[2], oh = ys[3], ow = ys[4], k = g.kernel;
    const double k3 = static_cast<double>(k * k * k);
    std::vector<double> ry(y.numel(), 0.0), rdx(x.numel(), 0.0);
    for (int64_t v = 0; v < xs[0] * xs[1]; ++v)
      for (int64_t i = 0; i < od; ++i)
        for (int64_t j = 0; j < oh; ++j)
          for (int64_t l = 0; l < ow; ++l) {
            const int64_t o = ((v * od + i) * oh + j) * ow + l;
            for (int64_t a = i * g.stride - g.padding; a < i * g.stride - g.padding + k; ++a)
              for (int64_t b = j * g.stride - g.padding; b < j * g.stride - g.padding + k; ++b)
                for (int64_t c = l * g.stride - g.padding; c < l * g.stride - g.padding + k; ++c) {
                  if (a < 0 || a >= d || b < 0 || b >= h || c < 0 || c >= w) continue;  // padding: 0
                  const int64_t in = ((v * d + a) * h + b) * w + c;
                  ry[o] += x.f32()[in] / k3;
                  rdx[in] += r.f32()[o] / k3;
                }
          }
    EXPECT_TRUE(matches(y, ry, 1e-6, 1e-5));
    EXPECT_TRUE(matches(dx, rdx, 1e-6, 1e-5));
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST_P(AvgPool3dOnBackend, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(407);
  for (const PoolGeometry& g : kGeoms) {
    Tensor x = ft::random_tensor(kShape, rng);
    const Shape ys = kernels::pool3d_output_shape(x.shape(), g);
    Tensor r = ft::random_tensor(ys, rng), yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::avgpool3d_backward(ctx(), up(r), g, dxd);
    const Tensor dx = down(dxd);
    auto loss = [&] {
      kernels::avgpool3d_forward(ctx(), up(x), g, yd);
      return ft::dot(down(yd), r);
    };
    auto res = ft::grad_check_detail(loss, x, dx, 1e-2);
    EXPECT_LT(res.worst, 1e-2) << str(g);
  }
}

TEST_P(Upsample3dOnBackend, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(404);
  for (const Shape& s : {kShape, Shape{1, 2, 3, 1, 4}, Shape{3, 1, 2, 5, 3}, Shape{1, 4, 7, 9, 8}})
    for (int64_t scale : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << s.str() << " scale " << scale);
      Tensor x = ft::random_tensor(s, rng);
      const Shape ys = kernels::upsample3d_output_shape(s, scale);
      Tensor r = ft::random_tensor(ys, rng);
      Tensor xd = up(x), rd = up(r), yd = poisoned(ys), dxd = poisoned(s);
      kernels::upsample3d_nearest_forward(ctx(), xd, scale, yd);
      kernels::upsample3d_nearest_backward(ctx(), rd, scale, dxd);
      const Tensor y = down(yd), dx = down(dxd);
      const std::vector<double> ry = naive_upsample3d(x, scale), rdx = naive_upsample3d_grad(r, s, scale);
      ASSERT_EQ(y.numel(), static_cast<int64_t>(ry.size()));
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.f32()[i], ry[i]) << i;  // a copy: exact
      for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.f32()[i], rdx[i], 1e-5) << i;
      EXPECT_GT(ft::l2_norm(y), 0.0);
      EXPECT_GT(ft::l2_norm(dx), 0.0);
    }
}

TEST_P(Upsample3dOnBackend, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(405);
  for (int64_t scale : {2, 3}) {
    Tensor x = ft::random_tensor(Shape{2, 2, 3, 4, 5}, rng);
    const Shape ys = kernels::upsample3d_output_shape(x.shape(), scale);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor rd = up(r), yd = poisoned(ys), dxd = poisoned(x.shape());
    kernels::upsample3d_nearest_backward(ctx(), rd, scale, dxd);
    const Tensor dx = down(dxd);
    auto loss = [&] {
      Tensor xe = up(x);
      kernels::upsample3d_nearest_forward(ctx(), xe, scale, yd);
      return ft::dot(down(yd), r);
    };
    auto res = ft::grad_check_detail(loss, x, dx);
    EXPECT_LT(res.worst, 1e-2) << "scale " << scale;
    EXPECT_EQ(res.checked, static_cast<int>(x.numel())) << "scale " << scale;  // linear: no kinks
  }
}

TEST_P(Pool3dErrorsOnBackend, Throw) {
  Tensor x = up(Tensor::zeros(Shape{2, 3, 5, 7, 6}));
  const PoolGeometry g{2, 2, 0};
  Tensor y = up(Tensor::zeros(Shape{2, 3, 2, 3, 3})), arg = up(Tensor::zeros(Shape{2, 3, 2, 3, 3}, DType::I32));
  Tensor y_bad = up(Tensor::zeros(Shape{2, 3, 2, 3, 4})), arg_f32 = up(Tensor::zeros(Shape{2, 3, 2, 3, 3}));
  Tensor x4 = up(Tensor::zeros(Shape{2, 3, 7, 6})), y4 = up(Tensor::zeros(Shape{2, 3, 3, 3}));
  EXPECT_NO_THROW(kernels::maxpool3d_forward(ctx(), x, g, y, arg));
  EXPECT_THROW(kernels::maxpool3d_forward(ctx(), x, g, y_bad, arg), Error);
  EXPECT_THROW(kernels::maxpool3d_forward(ctx(), x, g, y, arg_f32), Error);
  EXPECT_THROW(kernels::maxpool3d_forward(ctx(), x, {2, 2, 2}, y, arg), Error);
  EXPECT_THROW(kernels::maxpool3d_forward(ctx(), x4, g, y4, arg), Error);
  Tensor dx_bad = up(Tensor::zeros(Shape{2, 4, 5, 7, 6}));
  EXPECT_NO_THROW(kernels::maxpool3d_backward(ctx(), y, arg, x));
  EXPECT_THROW(kernels::maxpool3d_backward(ctx(), y, arg, dx_bad), Error);
  EXPECT_THROW(kernels::maxpool3d_backward(ctx(), y_bad, arg, x), Error);
  Tensor u = up(Tensor::zeros(Shape{2, 3, 10, 14, 12})), u_bad = up(Tensor::zeros(Shape{2, 3, 10, 14, 13}));
  EXPECT_NO_THROW(kernels::upsample3d_nearest_forward(ctx(), x, 2, u));
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), x, 2, u_bad), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), x, 3, u), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), x, 0, u), Error);
  EXPECT_NO_THROW(kernels::upsample3d_nearest_backward(ctx(), u, 2, x));
  EXPECT_THROW(kernels::upsample3d_nearest_backward(ctx(), u_bad, 2, x), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_backward(ctx(), x4, 1, x4), Error);
}

TEST(Pool3d, ArgmaxOutsideTheVolumeIsRefused) {
  // Checked on the host before writing (CPU): never written out of bounds.
  Context ctx(Device::cpu());
  Tensor x = Tensor::zeros(Shape{2, 3, 5, 7, 6});
  Tensor y = Tensor::zeros(Shape{2, 3, 2, 3, 3}), arg = Tensor::zeros(Shape{2, 3, 2, 3, 3}, DType::I32);
  arg.data<int32_t>()[0] = 5 * 7 * 6;
  EXPECT_THROW(kernels::maxpool3d_backward(ctx, y, arg, x), Error);
}

}  // namespace
}  // namespace fanout
