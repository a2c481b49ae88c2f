// Max / average pooling of both ranks (one body runs 2-D and 3-D), global
// average pooling and nearest 3-D upsampling on every backend against naive
// float64 references over several geometries: argmax and first-max-wins ties
// (also with CUDA's deterministic mode), padding never selected by max
// pooling, NaN propagation, count_include_pad averaging (kernel^rank), volumes
// with D != H != W, central-difference gradients (overlapping windows
// accumulate), the upsampled gradient summing its s^3 copies, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/storage_test_util.h"
#include "kernels/pool.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;
using kernels::PoolGeometry;

std::string str(const PoolGeometry& g) {
  return "k" + std::to_string(g.kernel) + " s" + std::to_string(g.stride) + " p" + std::to_string(g.padding);
}

const std::vector<PoolGeometry> kGeoms = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0},
                                          {3, 3, 0}, {5, 2, 2}, {1, 1, 0}, {4, 3, 2}};
constexpr int kRanks[] = {2, 3};
// The shape each body pools at rank 2 and 3 (D != H != W).
Shape base_shape(int spatial) { return spatial == 2 ? Shape{3, 5, 7, 9} : Shape{2, 3, 5, 7, 6}; }
// (N, C, 2, ..., 2) or any per-axis extents, at the given rank.
Shape shape_of(int spatial, int64_t n, int64_t c, int64_t d, int64_t h, int64_t w) {
  return spatial == 2 ? Shape{n, c, h, w} : Shape{n, c, d, h, w};
}

// The reference's view of a pooling: (volumes, D, H, W) with D = 1 and a
// depth window of 1 at rank 2, and the output extents.
struct Ref {
  int64_t vols, len[3], out[3], k[3], stride[3], pad[3];
  Ref(int spatial, const Shape& x, const PoolGeometry& g) {
    vols = x[0] * x[1];
    for (int a = 0; a < 3; ++a) {
      const bool real = a > 0 || spatial == 3;
      len[a] = real ? x[a + x.ndim - 3] : 1;
      k[a] = real ? g.kernel : 1;
      stride[a] = real ? g.stride : 1;
      pad[a] = real ? g.padding : 0;
      out[a] = (len[a] + 2 * pad[a] - k[a]) / stride[a] + 1;
    }
  }
  int64_t in_volume() const { return len[0] * len[1] * len[2]; }
  int64_t out_volume() const { return out[0] * out[1] * out[2]; }
  // f(o, i): output o (flat over all volumes) and each input i inside its
  // window (flat, in bounds), taps in (depth, row, column) order.
  void each_tap(const std::function<void(int64_t, int64_t)>& f) const {
    for (int64_t v = 0; v < vols; ++v)
      for (int64_t od = 0; od < out[0]; ++od)
        for (int64_t oh = 0; oh < out[1]; ++oh)
          for (int64_t ow = 0; ow < out[2]; ++ow) {
            const int64_t o = ((v * out[0] + od) * out[1] + oh) * out[2] + ow;
            for (int64_t a = 0; a < k[0]; ++a)
              for (int64_t b = 0; b < k[1]; ++b)
                for (int64_t c = 0; c < k[2]; ++c) {
                  const int64_t p = od * stride[0] - pad[0] + a, q = oh * stride[1] - pad[1] + b,
                                r = ow * stride[2] - pad[2] + c;
                  if (p < 0 || p >= len[0] || q < 0 || q >= len[1] || r < 0 || r >= len[2]) continue;
                  f(o, v * in_volume() + (p * len[1] + q) * len[2] + r);
                }
          }
  }
};

// Naive max pooling: the first strict maximum of each window; argmax within the volume.
void naive_maxpool(const Ref& ref, const Tensor& x, std::vector<float>& y, std::vector<int32_t>& arg) {
  y.assign(ref.vols * ref.out_volume(), -std::numeric_limits<float>::infinity());
  arg.assign(y.size(), -1);
  ref.each_tap([&](int64_t o, int64_t i) {
    if (arg[o] < 0 || x.f32()[i] > y[o]) {
      y[o] = x.f32()[i];
      arg[o] = static_cast<int32_t>(i % ref.in_volume());
    }
  });
}

Tensor tied_tensor(const Shape& s, std::mt19937_64& rng) {  // a few values, so windows hold ties
  Tensor t = ft::random_tensor(s, rng);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::round(t.f32()[i] * 2.0f) / 2.0f;
  return t;
}

TEST(Pool, OutputShapes) {
  EXPECT_EQ(kernels::pool_output_shape(2, Shape{3, 5, 7, 9}, {2, 2, 0}), (Shape{3, 5, 3, 4}));
  EXPECT_EQ(kernels::pool_output_shape(2, Shape{3, 5, 7, 9}, {3, 2, 1}), (Shape{3, 5, 4, 5}));
  EXPECT_EQ(kernels::pool_output_shape(2, Shape{1, 1, 28, 28}, {2, 2, 0}), (Shape{1, 1, 14, 14}));
  EXPECT_EQ(kernels::pool_output_shape(3, Shape{2, 3, 5, 7, 6}, {2, 2, 0}), (Shape{2, 3, 2, 3, 3}));
  EXPECT_EQ(kernels::pool_output_shape(3, Shape{2, 3, 5, 7, 6}, {3, 2, 1}), (Shape{2, 3, 3, 4, 3}));
  EXPECT_EQ(kernels::pool_output_shape(3, Shape{1, 1, 32, 64, 48}, {2, 2, 0}), (Shape{1, 1, 16, 32, 24}));
  for (int s : kRanks) {
    SCOPED_TRACE(s);
    EXPECT_THROW(kernels::pool_output_shape(s, base_shape(s), {3, 2, 2}), Error);  // padding > kernel / 2
    EXPECT_THROW(kernels::pool_output_shape(s, shape_of(s, 3, 5, 5, 2, 9), {4, 1, 0}), Error);  // kernel > input
    EXPECT_THROW(kernels::pool_output_shape(s, base_shape(s), {2, 0, 0}), Error);  // stride 0
    EXPECT_THROW(kernels::pool_output_shape(s, base_shape(5 - s), {2, 2, 0}), Error);  // the other rank
  }
  EXPECT_THROW(kernels::pool_output_shape(1, Shape{3, 5, 7}, {2, 2, 0}), Error);
  EXPECT_EQ(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 2), (Shape{2, 3, 10, 14, 12}));
  EXPECT_EQ(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 1), (Shape{2, 3, 5, 7, 6}));
  EXPECT_THROW(kernels::upsample3d_output_shape(Shape{2, 3, 5, 7, 6}, 0), Error);
  EXPECT_THROW(kernels::upsample3d_output_shape(Shape{2, 3, 7, 6}, 2), Error);
}

FANOUT_BACKEND_SUITE(MaxPool);
FANOUT_BACKEND_SUITE(AvgPool);
FANOUT_BACKEND_SUITE(GlobalAvgPool);
FANOUT_BACKEND_SUITE(Upsample3d);
FANOUT_BACKEND_SUITE(PoolErrors);

TEST_P(MaxPool, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(71);
  struct Case {
    int spatial;
    Shape x;
    PoolGeometry g;
    bool ties, deterministic;
    int threads = 0;  // CPU kernel threads; 0: the context's default
  };
  std::vector<Case> cases;
  for (int s : kRanks)
    for (const PoolGeometry& g : kGeoms)
      for (bool ties : {false, true})
        for (bool det : {false, true}) cases.push_back({s, base_shape(s), g, ties, det});
  cases.push_back({2, Shape{4, 64, 32, 32}, {3, 2, 1}, false, false});
  cases.push_back({3, Shape{2, 8, 9, 16, 13}, {3, 2, 1}, false, false});
  cases.push_back({3, Shape{1, 2, 3, 11, 4}, {3, 2, 1}, true, true});
  // 2x2 windows over cnn's planes (rows of 14, 7 and 3 outputs) and odd 3-D
  // ones, on three threads too: the CPU computes rows a vector's width at a
  // time, running on into the next row, never into another thread's.
  for (int threads : {0, 3}) {
    cases.push_back({2, Shape{40, 32, 28, 28}, {2, 2, 0}, false, false, threads});
    cases.push_back({2, Shape{96, 21, 14, 14}, {2, 2, 0}, true, false, threads});
    cases.push_back({2, Shape{128, 35, 7, 7}, {2, 2, 0}, false, false, threads});
    cases.push_back({3, Shape{40, 9, 5, 7, 9}, {2, 2, 0}, true, false, threads});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.x.str() << " " << str(c.g) << " ties " << c.ties << " deterministic "
                                      << c.deterministic << " threads " << c.threads);
    ctx().math.deterministic = c.deterministic;
    ctx().math.cpu_threads = c.threads;
    struct Restore {
      Context& c;
      ~Restore() { c.math.cpu_threads = 0; }
    } restore{ctx()};  // an ASSERT returns early
    Tensor x = c.ties ? tied_tensor(c.x, rng) : ft::random_tensor(c.x, rng);
    const Shape ys = kernels::pool_output_shape(c.spatial, x.shape(), c.g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
    kernels::maxpool_forward(ctx(), c.spatial, xd, c.g, yd, argd);
    kernels::maxpool_backward(ctx(), c.spatial, rd, argd, dxd);
    const Tensor y = down(yd), arg = down(argd), dx = down(dxd);
    const Ref ref(c.spatial, c.x, c.g);
    std::vector<float> ry;
    std::vector<int32_t> ra;
    naive_maxpool(ref, x, ry, ra);
    ASSERT_EQ(y.numel(), static_cast<int64_t>(ry.size()));
    for (int64_t i = 0; i < y.numel(); ++i) {
      ASSERT_EQ(y.f32()[i], ry[i]) << i;
      ASSERT_EQ(arg.data<int32_t>()[i], ra[i]) << i;
    }
    EXPECT_GT(ft::l2_norm(y), 0.0);
    // Backward: scatter-add dy through the naive argmax (overlapping windows accumulate).
    std::vector<double> rdx(x.numel(), 0.0);
    for (int64_t i = 0; i < r.numel(); ++i) rdx[(i / ref.out_volume()) * ref.in_volume() + ra[i]] += r.f32()[i];
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_NEAR(dx.f32()[i], rdx[i], 1e-5) << i;
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

// Channels-last storage (the CPU's row kernels; CUDA's native ones): every
// geometry, ties (first maximum wins), NaN and thread counts as above, the
// selected values and argmax exactly the naive ones, dx the scatter of dy
// (overlapping windows' sums rounded once to the type).
TEST_P(MaxPool, ChannelsLastAgainstNaive) {
  std::mt19937_64 rng(75);
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (int s : kRanks)
      for (const PoolGeometry& g : kGeoms)
        for (int threads : {0, 3}) {
          const Shape xs = s == 2 ? Shape{4, 19, 7, 9} : Shape{3, 6, 5, 7, 6};
          SCOPED_TRACE(::testing::Message() << dtype_name(t) << " " << xs.str() << " " << str(g) << " threads "
                                            << threads);
          ctx().math.cpu_threads = threads;
          struct Restore {
            Context& c;
            ~Restore() { c.math.cpu_threads = 0; }
          } restore{ctx()};
          Tensor x32 = tied_tensor(xs, rng);
          x32.f32()[5] = std::nanf("");  // NaN propagates and is selected
          const Tensor x = ft::stored_copy(x32, t, MemoryFormat::ChannelsLast);
          const Shape ys = kernels::pool_output_shape(s, xs, g);
          const Tensor r = ft::stored_copy(ft::random_tensor(ys, rng), t, MemoryFormat::ChannelsLast);
          Tensor yd = up(ft::poisoned_stored(ys, t, MemoryFormat::ChannelsLast)), argd = poisoned(ys, DType::I32);
          Tensor dxd = up(ft::poisoned_stored(xs, t, MemoryFormat::ChannelsLast));
          kernels::maxpool_forward(ctx(), s, up(x), g, yd, argd);
          kernels::maxpool_backward(ctx(), s, up(r), argd, dxd);
          const Tensor y = down(yd), arg = down(argd), dx = down(dxd);
          const Ref ref(s, xs, g);
          std::vector<float> ry;
          std::vector<int32_t> ra;
          const Tensor xv = ft::float32_values(x);
          naive_maxpool(ref, xv, ry, ra);
          ref.each_tap([&](int64_t o, int64_t i) {  // a window holding the NaN selects it (the only one)
            if (std::isnan(xv.f32()[i])) {
              ry[o] = xv.f32()[i];
              ra[o] = static_cast<int32_t>(i % ref.in_volume());
            }
          });
          int nans = 0;
          for (int64_t o = 0; o < y.numel(); ++o) {
            const float got = ft::stored(y, o);
            nans += std::isnan(got);
            ASSERT_TRUE(got == ry[o] || (std::isnan(got) && std::isnan(ry[o]))) << o << ": " << got << " vs " << ry[o];
            ASSERT_EQ(arg.data<int32_t>()[o], ra[o]) << o;
          }
          EXPECT_GT(nans, 0);
          const Tensor r32 = ft::float32_values(r);
          std::vector<double> rdx(x.numel(), 0.0);
          for (int64_t o = 0; o < r.numel(); ++o) rdx[(o / ref.out_volume()) * ref.in_volume() + ra[o]] += r32.f32()[o];
          const double u = ft::unit_roundoff(t);
          for (int64_t i = 0; i < x.numel(); ++i)
            ASSERT_NEAR(ft::stored(dx, i), rdx[i], u * std::abs(rdx[i]) + 1e-6) << i;
        }
}

TEST_P(MaxPool, TiesPickFirstAndPaddingIsNeverSelected) {
  for (int s : kRanks) {
    SCOPED_TRACE(s);
    // All-equal negative input: padding (0 if it were selectable) must lose,
    // and the first position of each clipped window wins.
    const Shape xs = shape_of(s, 1, 2, 4, 5, 6);
    Tensor x = Tensor::empty(xs);
    x.fill(-3.0f);
    const PoolGeometry g{3, 2, 1};
    const Shape ys = kernels::pool_output_shape(s, xs, g);
    Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
    kernels::maxpool_forward(ctx(), s, xd, g, yd, argd);
    const Tensor y = down(yd), arg = down(argd);
    const Ref ref(s, xs, g);
    std::vector<int32_t> first(ys.numel(), -1);
    ref.each_tap([&](int64_t o, int64_t i) {
      if (first[o] < 0) first[o] = static_cast<int32_t>(i % ref.in_volume());
    });
    for (int64_t o = 0; o < ys.numel(); ++o) {
      EXPECT_EQ(y.f32()[o], -3.0f) << o;
      EXPECT_EQ(arg.data<int32_t>()[o], first[o]) << o;
    }
    // A repeated maximum inside one window: the first in (depth, row, column) order wins.
    Tensor z = Tensor::zeros(shape_of(s, 1, 1, 2, 2, 2));
    const int64_t early = z.numel() / 2 - 1;  // (0, 1) or (0, 1, 1)
    z.f32()[early] = 5.0f;
    z.f32()[z.numel() - 1] = 5.0f;
    const Shape one = shape_of(s, 1, 1, 1, 1, 1);
    Tensor zd = up(z), zyd = poisoned(one), zad = poisoned(one, DType::I32);
    kernels::maxpool_forward(ctx(), s, zd, {2, 2, 0}, zyd, zad);
    EXPECT_EQ(down(zyd).f32()[0], 5.0f);
    EXPECT_EQ(down(zad).data<int32_t>()[0], early);
  }
}

// A stride longer than the padded input leaves one window per axis, as in
// torch, whatever the stride's size (2^33 here: past any 32-bit index).
TEST_P(MaxPool, AStrideLongerThanTheInputIsOneWindow) {
  std::mt19937_64 rng(77);
  const PoolGeometry g{2, int64_t{1} << 33, 0};
  const Tensor x = ft::random_tensor(Shape{2, 3, 5, 4}, rng);
  const Shape ys = kernels::pool_output_shape(2, x.shape(), g);
  ASSERT_EQ(ys, (Shape{2, 3, 1, 1}));
  const Tensor r = ft::random_tensor(ys, rng);
  Tensor my = poisoned(ys), ay = poisoned(ys), arg = poisoned(ys, DType::I32), mdx = poisoned(x.shape()),
         adx = poisoned(x.shape());
  const Tensor xd = up(x), rd = up(r);
  kernels::maxpool_forward(ctx(), 2, xd, g, my, arg);
  kernels::maxpool_backward(ctx(), 2, rd, arg, mdx);
  kernels::avgpool_forward(ctx(), 2, xd, g, ay);
  kernels::avgpool_backward(ctx(), 2, rd, g, adx);
  const Tensor gm = down(my), ga = down(ay), gmdx = down(mdx), gadx = down(adx);
  for (int64_t v = 0; v < 6; ++v) {
    const float* p = x.f32() + v * 20;
    int64_t best = 0;  // the first maximum of the window rows 0-1, columns 0-1
    for (int64_t k : {1, 4, 5})
      if (p[k] > p[best]) best = k;
    EXPECT_EQ(gm.f32()[v], p[best]) << v;
    EXPECT_NEAR(ga.f32()[v], (double(p[0]) + p[1] + p[4] + p[5]) / 4.0, 1e-6) << v;
    for (int64_t k = 0; k < 20; ++k) {
      const bool in = k == 0 || k == 1 || k == 4 || k == 5;
      EXPECT_EQ(gmdx.f32()[v * 20 + k], k == best ? r.f32()[v] : 0.0f) << v << " " << k;
      EXPECT_NEAR(gadx.f32()[v * 20 + k], in ? r.f32()[v] / 4.0 : 0.0, 1e-7) << v << " " << k;
    }
  }
}

TEST_P(MaxPool, NanPropagates) {
  // As PyTorch's kernels: a NaN in a window is the maximum (and its argmax), on every code path.
  std::mt19937_64 rng(75);
  for (int s : kRanks)
    for (const PoolGeometry& g : {PoolGeometry{2, 2, 0}, PoolGeometry{3, 2, 1}}) {
      SCOPED_TRACE(std::to_string(s) + " " + str(g));
      const Shape xs = shape_of(s, 1, 1, 4, 6, 5);
      Tensor x = ft::random_tensor(xs, rng);
      const int64_t nan_at = s == 2 ? 1 * 5 + 1 : (1 * 6 + 1) * 5 + 1;  // inside output 0's window for both
      x.f32()[nan_at] = std::numeric_limits<float>::quiet_NaN();
      const Shape ys = kernels::pool_output_shape(s, xs, g);
      Tensor xd = up(x), yd = poisoned(ys), argd = poisoned(ys, DType::I32);
      kernels::maxpool_forward(ctx(), s, xd, g, yd, argd);
      const Tensor y = down(yd), arg = down(argd);
      EXPECT_TRUE(std::isnan(y.f32()[0]));
      EXPECT_EQ(arg.data<int32_t>()[0], nan_at);
      EXPECT_FALSE(std::isnan(y.f32()[ys.numel() - 1]));
    }
}

TEST_P(MaxPool, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(72);
  for (int s : kRanks)
    for (const PoolGeometry& g : kGeoms) {
      SCOPED_TRACE(std::to_string(s) + " " + str(g));
      Tensor x = ft::random_tensor(base_shape(s), rng);
      const Shape ys = kernels::pool_output_shape(s, x.shape(), g);
      Tensor r = ft::random_tensor(ys, rng);
      Tensor xd = up(x), rd = up(r), yd = poisoned(ys), argd = poisoned(ys, DType::I32), dxd = poisoned(x.shape());
      kernels::maxpool_forward(ctx(), s, xd, g, yd, argd);
      kernels::maxpool_backward(ctx(), s, rd, argd, dxd);
      const Tensor dx = down(dxd);
      auto loss = [&] {  // <r, y>, accumulated in float64
        Tensor xe = up(x);
        kernels::maxpool_forward(ctx(), s, xe, g, yd, argd);
        return ft::dot(down(yd), r);
      };
      // A small step: random inputs are rarely closer than 1e-3, so few entries are kinks.
      auto res = ft::grad_check_detail(loss, x, dx, 1e-3);
      EXPECT_LT(res.worst, 1e-2);
      EXPECT_GT(res.checked, 150);
    }
}

// Max and average pooling on low-type storage in either format, both ranks:
// max pooling selects stored values exactly (and scatters dy exactly), the
// averages round once to the type.
TEST_P(AvgPool, MaxAndAverageOnLowStorage) {
  std::mt19937_64 rng(74);
  const PoolGeometry g{3, 2, 1};
  for (const ft::StorageCase& sc : ft::low_storage_cases())
    for (int s : kRanks) {
      const Shape xs = shape_of(s, 2, 5, 5, 7, 6);
      SCOPED_TRACE(sc.name() + " " + xs.str());
      const Shape ys = kernels::pool_output_shape(s, xs, g);
      const Tensor x = ft::stored_copy(ft::random_tensor(xs, rng), sc.dtype, sc.format);
      const Tensor r = ft::stored_copy(ft::random_tensor(ys, rng), sc.dtype, sc.format);
      Tensor xd = up(x), rd = up(r), arg = poisoned(ys, DType::I32);
      Tensor my = up(ft::poisoned_stored(ys, sc.dtype, sc.format)), mdx = up(ft::poisoned_stored(xs, sc.dtype, sc.format));
      Tensor ay = up(ft::poisoned_stored(ys, sc.dtype, sc.format)), adx = up(ft::poisoned_stored(xs, sc.dtype, sc.format));
      kernels::maxpool_forward(ctx(), s, xd, g, my, arg);
      kernels::maxpool_backward(ctx(), s, rd, arg, mdx);
      kernels::avgpool_forward(ctx(), s, xd, g, ay);
      kernels::avgpool_backward(ctx(), s, rd, g, adx);
      const Tensor x32 = ft::float32_values(x), r32 = ft::float32_values(r);
      std::vector<float> want_max;
      std::vector<int32_t> want_arg;
      const Ref ref(s, xs, g);
      naive_maxpool(ref, x32, want_max, want_arg);
      const double divisor = std::pow(static_cast<double>(g.kernel), s), u = ft::unit_roundoff(sc.dtype);
      std::vector<double> ry(ref.vols * ref.out_volume(), 0.0), rdx(x.numel(), 0.0), mdx_want(x.numel(), 0.0);
      ref.each_tap([&](int64_t o, int64_t i) {
        ry[o] += x32.f32()[i] / divisor;
        rdx[i] += r32.f32()[o] / divisor;
      });
      for (int64_t o = 0; o < static_cast<int64_t>(want_arg.size()); ++o)
        mdx_want[o / ref.out_volume() * ref.in_volume() + want_arg[o]] += r32.f32()[o];
      const Tensor got_my = down(my), got_mdx = down(mdx), got_ay = down(ay), got_adx = down(adx);
      for (int64_t o = 0; o < got_my.numel(); ++o) {
        ASSERT_EQ(ft::stored(got_my, o), want_max[o]) << o;
        ASSERT_NEAR(ft::stored(got_ay, o), ry[o], u * std::abs(ry[o]) + 1e-6) << o;
      }
      // Overlapping windows add gradients: those sums round once too.
      for (int64_t i = 0; i < x.numel(); ++i) {
        ASSERT_NEAR(ft::stored(got_mdx, i), mdx_want[i], u * std::abs(mdx_want[i]) + 1e-6) << i;
        ASSERT_NEAR(ft::stored(got_adx, i), rdx[i], u * std::abs(rdx[i]) + 1e-6) << i;
      }
    }
}

TEST_P(AvgPool, ForwardBackwardAgainstFloat64) {
  std::mt19937_64 rng(73);
  std::vector<std::pair<Shape, PoolGeometry>> cases;
  for (int s : kRanks)
    for (const PoolGeometry& g : kGeoms) cases.emplace_back(base_shape(s), g);
  cases.emplace_back(Shape{3, 5, 7, 9}, PoolGeometry{4, 4, 2});
  cases.emplace_back(Shape{1, 2, 9, 16, 13}, PoolGeometry{3, 2, 1});
  for (const auto& [xs, g] : cases) {
    SCOPED_TRACE(xs.str() + " " + str(g));
    const int s = xs.ndim - 2;
    Tensor x = ft::random_tensor(xs, rng);
    const Shape ys = kernels::pool_output_shape(s, xs, g);
    Tensor r = ft::random_tensor(ys, rng);
    Tensor yd = poisoned(ys), dxd = poisoned(xs);
    kernels::avgpool_forward(ctx(), s, up(x), g, yd);
    kernels::avgpool_backward(ctx(), s, up(r), g, dxd);
    const Tensor y = down(yd), dx = down(dxd);
    // count_include_pad: every window divides by kernel^rank; padding adds 0.
    const double divisor = std::pow(static_cast<double>(g.kernel), s);
    std::vector<double> ry(y.numel(), 0.0), rdx(x.numel(), 0.0);
    Ref(s, xs, g).each_tap([&](int64_t o, int64_t i) {
      ry[o] += x.f32()[i] / divisor;
      rdx[i] += r.f32()[o] / divisor;
    });
    EXPECT_TRUE(matches(y, ry, 1e-6, 1e-5));
    EXPECT_TRUE(matches(dx, rdx, 1e-6, 1e-5));
    EXPECT_GT(ft::l2_norm(y), 0.0);
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST_P(AvgPool, BackwardMatchesCentralDifferences) {
  std::mt19937_64 rng(74);
  for (int s : kRanks)
    for (const PoolGeometry& g : kGeoms) {
      SCOPED_TRACE(std::to_string(s) + " " + str(g));
      Tensor x = ft::random_tensor(base_shape(s), rng);
      const Shape ys = kernels::pool_output_shape(s, x.shape(), g);
      Tensor r = ft::random_tensor(ys, rng), yd = poisoned(ys), dxd = poisoned(x.shape());
      kernels::avgpool_backward(ctx(), s, up(r), g, dxd);
      const Tensor dx = down(dxd);
      auto loss = [&] {
        kernels::avgpool_forward(ctx(), s, up(x), g, yd);
        return ft::dot(down(yd), r);
      };
      auto res = ft::grad_check_detail(loss, x, dx);
      EXPECT_LT(res.worst, 1e-2);
      EXPECT_GT(res.checked, 150);
    }
}

TEST_P(GlobalAvgPool, ForwardBackward) {
  std::mt19937_64 rng(76);
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

// Naive nearest upsampling: y at (i, j, l) reads x at (i / s, j / s, l / s);
// the gradient of x sums dy over every output reading it (float64).
void naive_upsample3d(const Tensor& x, const Tensor& dy, int64_t s, std::vector<double>& y, std::vector<double>& dx) {
  const int64_t vols = x.size(0) * x.size(1), d = x.size(2), h = x.size(3), w = x.size(4);
  y.assign(dy.numel(), 0.0);
  dx.assign(x.numel(), 0.0);
  for (int64_t v = 0; v < vols; ++v)
    for (int64_t i = 0; i < d * s; ++i)
      for (int64_t j = 0; j < h * s; ++j)
        for (int64_t l = 0; l < w * s; ++l) {
          const int64_t o = ((v * d * s + i) * h * s + j) * w * s + l, in = ((v * d + i / s) * h + j / s) * w + l / s;
          y[o] = x.f32()[in];
          dx[in] += dy.f32()[o];
        }
}

TEST_P(Upsample3d, ForwardBackwardAgainstNaive) {
  std::mt19937_64 rng(404);
  for (const Shape& s : {base_shape(3), Shape{1, 2, 3, 1, 4}, Shape{3, 1, 2, 5, 3}, Shape{1, 4, 7, 9, 8}})
    for (int64_t scale : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << s.str() << " scale " << scale);
      Tensor x = ft::random_tensor(s, rng);
      const Shape ys = kernels::upsample3d_output_shape(s, scale);
      Tensor r = ft::random_tensor(ys, rng);
      Tensor xd = up(x), rd = up(r), yd = poisoned(ys), dxd = poisoned(s);
      kernels::upsample3d_nearest_forward(ctx(), xd, scale, yd);
      kernels::upsample3d_nearest_backward(ctx(), rd, scale, dxd);
      const Tensor y = down(yd), dx = down(dxd);
      std::vector<double> ry, rdx;
      naive_upsample3d(x, r, scale, ry, rdx);
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.f32()[i], ry[i]) << i;  // a copy: exact
      for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.f32()[i], rdx[i], 1e-5) << i;
      EXPECT_GT(ft::l2_norm(y), 0.0);
      EXPECT_GT(ft::l2_norm(dx), 0.0);
    }
}

// Global average pooling and upsampling on low-type storage, either format
// (2-D and 3-D volumes): values against float64 of the stored ones, within
// one rounding to the type.
TEST_P(Upsample3d, GlobalAverageAndUpsamplingOnLowStorage) {
  std::mt19937_64 rng(405);
  for (const ft::StorageCase& sc : ft::low_storage_cases()) {
    SCOPED_TRACE(sc.name());
    const double u = ft::unit_roundoff(sc.dtype);
    const Shape gs{3, 5, 4, 6}, gy{3, 5, 1, 1};
    const Tensor gx = ft::stored_copy(ft::random_tensor(gs, rng), sc.dtype, sc.format);
    const Tensor gr = ft::stored_copy(ft::random_tensor(gy, rng), sc.dtype, sc.format);
    Tensor yd = up(ft::poisoned_stored(gy, sc.dtype, sc.format)), dxd = up(ft::poisoned_stored(gs, sc.dtype, sc.format));
    kernels::global_avgpool_forward(ctx(), up(gx), yd);
    kernels::global_avgpool_backward(ctx(), up(gr), dxd);
    const Tensor y = down(yd), dx = down(dxd);
    for (int64_t p = 0; p < 15; ++p) {
      double m = 0;
      for (int64_t k = 0; k < 24; ++k) m += ft::stored(gx, p * 24 + k) / 24.0;
      ASSERT_NEAR(ft::stored(y, p), m, u * std::abs(m) + 1e-6) << p;
      for (int64_t k = 0; k < 24; ++k) {
        const double want = ft::stored(gr, p) / 24.0;
        ASSERT_NEAR(ft::stored(dx, p * 24 + k), want, u * std::abs(want) + 1e-7) << p << " " << k;
      }
    }
    const Shape us{2, 3, 2, 3, 4};
    const Shape uy = kernels::upsample3d_output_shape(us, 2);
    const Tensor ux = ft::stored_copy(ft::random_tensor(us, rng), sc.dtype, sc.format);
    const Tensor ur = ft::stored_copy(ft::random_tensor(uy, rng), sc.dtype, sc.format);
    Tensor uyd = up(ft::poisoned_stored(uy, sc.dtype, sc.format)), udxd = up(ft::poisoned_stored(us, sc.dtype, sc.format));
    kernels::upsample3d_nearest_forward(ctx(), up(ux), 2, uyd);
    kernels::upsample3d_nearest_backward(ctx(), up(ur), 2, udxd);
    std::vector<double> ry, rdx;
    naive_upsample3d(ft::float32_values(ux), ft::float32_values(ur), 2, ry, rdx);
    const Tensor uyh = down(uyd), udxh = down(udxd);
    for (int64_t i = 0; i < uyh.numel(); ++i) ASSERT_EQ(ft::stored(uyh, i), ry[i]) << i;  // a copy: exact
    for (int64_t i = 0; i < udxh.numel(); ++i)
      ASSERT_NEAR(ft::stored(udxh, i), rdx[i], u * std::abs(rdx[i]) + 1e-6) << i;
  }
}

TEST_P(Upsample3d, BackwardMatchesCentralDifferences) {
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

TEST_P(PoolErrors, Throw) {
  const PoolGeometry g{2, 2, 0};
  for (int s : kRanks) {
    SCOPED_TRACE(s);
    const Shape xs = base_shape(s), ys = kernels::pool_output_shape(s, xs, g);
    Shape ys_wide = ys, xs_channels = xs;
    ys_wide[s + 1] += 1;
    xs_channels[1] += 1;
    Tensor x = up(Tensor::zeros(xs)), y = up(Tensor::zeros(ys)), arg = up(Tensor::zeros(ys, DType::I32));
    Tensor y_bad = up(Tensor::zeros(ys_wide)), arg_f32 = up(Tensor::zeros(ys));
    Tensor x_other = up(Tensor::zeros(base_shape(5 - s)));
    EXPECT_NO_THROW(kernels::maxpool_forward(ctx(), s, x, g, y, arg));
    EXPECT_THROW(kernels::maxpool_forward(ctx(), s, x, g, y_bad, arg), Error);
    EXPECT_THROW(kernels::maxpool_forward(ctx(), s, x, g, y, arg_f32), Error);
    EXPECT_THROW(kernels::maxpool_forward(ctx(), s, x, {2, 2, 2}, y, arg), Error);
    EXPECT_THROW(kernels::maxpool_forward(ctx(), s, x_other, g, y, arg), Error);
    Tensor dx_bad = up(Tensor::zeros(xs_channels));
    EXPECT_NO_THROW(kernels::maxpool_backward(ctx(), s, y, arg, x));
    EXPECT_THROW(kernels::maxpool_backward(ctx(), s, y, arg, dx_bad), Error);
    EXPECT_THROW(kernels::maxpool_backward(ctx(), s, y_bad, arg, x), Error);
    EXPECT_THROW(kernels::avgpool_forward(ctx(), s, x, g, y_bad), Error);
    EXPECT_THROW(kernels::avgpool_backward(ctx(), s, y_bad, g, x), Error);
    EXPECT_THROW(kernels::avgpool_forward(ctx(), 5 - s, x, g, y), Error);
  }
  Tensor x = up(Tensor::zeros(base_shape(2))), g_bad = up(Tensor::zeros(Shape{3, 5, 1, 2}));
  EXPECT_THROW(kernels::global_avgpool_forward(ctx(), x, g_bad), Error);
  EXPECT_THROW(kernels::global_avgpool_backward(ctx(), g_bad, x), Error);
  Tensor v = up(Tensor::zeros(base_shape(3)));
  Tensor u = up(Tensor::zeros(Shape{2, 3, 10, 14, 12})), u_bad = up(Tensor::zeros(Shape{2, 3, 10, 14, 13}));
  EXPECT_NO_THROW(kernels::upsample3d_nearest_forward(ctx(), v, 2, u));
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), v, 2, u_bad), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), v, 3, u), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_forward(ctx(), v, 0, u), Error);
  EXPECT_NO_THROW(kernels::upsample3d_nearest_backward(ctx(), u, 2, v));
  EXPECT_THROW(kernels::upsample3d_nearest_backward(ctx(), u_bad, 2, v), Error);
  EXPECT_THROW(kernels::upsample3d_nearest_backward(ctx(), x, 1, x), Error);
}

TEST(Pool, ArgmaxOutsideTheVolumeIsRefused) {
  // Checked on the host before writing (CPU): never written out of bounds.
  Context ctx(Device::cpu());
  for (int s : kRanks) {
    const Shape xs = base_shape(s), ys = kernels::pool_output_shape(s, xs, {2, 2, 0});
    Tensor x = Tensor::zeros(xs), y = Tensor::zeros(ys), arg = Tensor::zeros(ys, DType::I32);
    arg.data<int32_t>()[0] = static_cast<int32_t>(xs.numel() / (xs[0] * xs[1]));
    EXPECT_THROW(kernels::maxpool_backward(ctx, s, y, arg, x), Error) << s;
    // The row kernels (channels-last storage) check it too.
    Tensor xl = Tensor::zeros(xs, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    const Tensor yl = Tensor::zeros(ys, DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    EXPECT_THROW(kernels::maxpool_backward(ctx, s, yl, arg, xl), Error) << s;
  }
}

}  // namespace
}  // namespace fanout
