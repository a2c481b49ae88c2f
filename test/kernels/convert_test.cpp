// Precision conversions on every backend against a reference built from the
// bit patterns alone (each pattern decoded by its formula in double; a
// float32 rounds to the nearer of two neighbouring patterns, the even one on
// a tie, to infinity past the largest finite value plus half its spacing):
// every bfloat16 and float16 pattern widened and narrowed back; midpoints,
// their float32 neighbours and the values just inside each pair for every
// pair of neighbours (subnormals, ties, overflow); NaN and the sign of zero.
// The channels-last copies and every type-and-format pair against the same
// decoding and an index map.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/convert.h"
#include "kernels/storage_test_util.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct Format {
  DType dtype;
  int exp_bits, man_bits;  // bfloat16 8, 7; float16 5, 10
  const char* name;
};
const Format kFormats[] = {{DType::BF16, 8, 7, "bfloat16"}, {DType::F16, 5, 10, "float16"}};

uint16_t inf_bits(const Format& f) { return static_cast<uint16_t>(((1u << f.exp_bits) - 1u) << f.man_bits); }

// The value of a pattern, from the format's definition.
double decode(const Format& f, uint16_t h) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const bool neg = h >> 15;
  const uint32_t e = (h >> f.man_bits) & ((1u << f.exp_bits) - 1u), m = h & ((1u << f.man_bits) - 1u);
  double v;
  if (e == (1u << f.exp_bits) - 1u)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.man_bits);
  else
    v = std::ldexp(static_cast<double>(m + (1u << f.man_bits)), static_cast<int>(e) - bias - f.man_bits);
  return neg ? -v : v;
}

class Convert : public ft::BackendTest {
 protected:
  // Values through the backend: float32 -> low -> float32 (and the low bits).
  std::vector<uint16_t> narrow(const Format& f, const std::vector<float>& xs) {
    Tensor x = Tensor::empty(Shape{static_cast<int64_t>(xs.size())});
    std::copy(xs.begin(), xs.end(), x.f32());
    Tensor xd = up(x), ld = up(Tensor::empty(x.shape(), f.dtype));
    kernels::convert(ctx(), xd, ld);
    const Tensor l = down(ld);
    return std::vector<uint16_t>(l.data<uint16_t>(), l.data<uint16_t>() + l.numel());
  }
  std::vector<float> widen(const Format& f, const std::vector<uint16_t>& hs) {
    Tensor h = Tensor::empty(Shape{static_cast<int64_t>(hs.size())}, f.dtype);
    std::copy(hs.begin(), hs.end(), h.data<uint16_t>());
    Tensor hd = up(h), xd = up(Tensor::empty(h.shape()));
    kernels::convert(ctx(), hd, xd);
    const Tensor x = down(xd);
    return std::vector<float>(x.f32(), x.f32() + x.numel());
  }
  std::vector<float> rounded(const Format& f, const std::vector<float>& xs) {
    Tensor x = Tensor::empty(Shape{static_cast<int64_t>(xs.size())});
    std::copy(xs.begin(), xs.end(), x.f32());
    Tensor xd = up(x);
    kernels::round_to(ctx(), xd, f.dtype);
    const Tensor r = down(xd);
    return std::vector<float>(r.f32(), r.f32() + r.numel());
  }
};
FANOUT_ON_EVERY_BACKEND(Convert);

TEST_P(Convert, EveryPatternWidensExactlyAndNarrowsBack) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    std::vector<uint16_t> all(65536);
    for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
    const std::vector<float> wide = widen(f, all);
    const std::vector<uint16_t> back = narrow(f, wide);
    int nans = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      const double want = decode(f, static_cast<uint16_t>(h));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(wide[h])) << std::hex << h;
        ASSERT_TRUE(std::isnan(decode(f, back[h]))) << "NaN narrowed to a number: " << std::hex << h;
        ++nans;
        continue;
      }
      ASSERT_EQ(static_cast<double>(wide[h]), want) << std::hex << h;
      ASSERT_EQ(std::signbit(wide[h]), (h >> 15) == 1) << std::hex << h;  // -0 stays -0
      ASSERT_EQ(back[h], h) << std::hex << h;
    }
    EXPECT_EQ(nans, 2 * ((1 << f.man_bits) - 1));
  }
}

TEST_P(Convert, RoundsToNearestEvenOverflowsToInfinity) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    std::vector<float> xs;
    std::vector<uint16_t> want;
    auto add = [&](double v, uint16_t h) {
      const float x = static_cast<float>(v);
      ASSERT_EQ(static_cast<double>(x), v) << "test value not exact in float32";
      xs.push_back(x);
      want.push_back(h);
      xs.push_back(-x);
      want.push_back(static_cast<uint16_t>(h | 0x8000u));
    };
    const uint16_t inf = inf_bits(f);
    for (uint16_t h = 0; h < inf; ++h) {  // every pair of neighbours (h, h + 1), h + 1 up to infinity
      const double a = decode(f, h);
      // Past the largest finite value the "neighbour" is where the next pattern would be.
      const double b = h + 1 < inf ? decode(f, static_cast<uint16_t>(h + 1)) : 2 * a - decode(f, h - 1);
      const double mid = (a + b) / 2;
      const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : h;
      add(mid, even);
      add(std::nextafter(static_cast<float>(mid), 0.0f), h);
      add(std::nextafter(static_cast<float>(mid), std::numeric_limits<float>::infinity()), static_cast<uint16_t>(h + 1));
      if (h > 0) add(std::nextafter(static_cast<float>(a), std::numeric_limits<float>::infinity()), h);
    }
    add(std::numeric_limits<float>::max(), inf);
    add(std::numeric_limits<float>::infinity(), inf);
    add(std::numeric_limits<float>::denorm_min(), 0);  // far below the smallest subnormal
    const std::vector<uint16_t> got = narrow(f, xs);
    for (size_t i = 0; i < xs.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << std::hex << "x bits " << half::bits_of(xs[i]) << " (" << xs[i] << ")";
    // round_to keeps the value in float32: the same numbers.
    const std::vector<float> r = rounded(f, xs);
    for (size_t i = 0; i < xs.size(); ++i) {
      const double w = decode(f, want[i]);
      ASSERT_EQ(static_cast<double>(r[i]), w) << "x " << xs[i];
      ASSERT_EQ(std::signbit(r[i]), std::signbit(xs[i])) << "x " << xs[i];
    }
    // NaN in, NaN out (any payload), through both.
    const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                                    half::float_of(0x7f800001u)};  // a signalling NaN's bits
    for (uint16_t h : narrow(f, nan)) EXPECT_TRUE(std::isnan(decode(f, h))) << std::hex << h;
    for (float v : rounded(f, nan)) EXPECT_TRUE(std::isnan(v));
  }
}

// The pattern nearest to a finite x (the even one on a tie, infinity past the
// largest finite value plus half its spacing), by bisection over the decoded
// values of the non-negative patterns.
uint16_t nearest(const Format& f, float x) {
  const double a = std::fabs(static_cast<double>(x));
  const uint32_t inf = inf_bits(f);
  uint32_t lo = 0, hi = inf;  // the largest h with decode(h) <= a
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (decode(f, static_cast<uint16_t>(mid)) <= a) lo = mid; else hi = mid - 1;
  }
  uint32_t h = lo;
  if (h < inf) {
    const double below = decode(f, static_cast<uint16_t>(h));
    const double above = h + 1 < inf ? decode(f, static_cast<uint16_t>(h + 1))
                                     : 2 * below - decode(f, static_cast<uint16_t>(h - 1));
    if (a - below > above - a || (a - below == above - a && (h & 1u))) ++h;
  }
  return static_cast<uint16_t>(h | (std::signbit(x) ? 0x8000u : 0u));
}

// Channels-first shapes: 2-D and 3-D activations, a filter (OC, C, k, k), and
// sizes that end tiles of 32 partway along both dims.
// Planes of one position or channel, of fewer positions than a tile row (3,
// 4, 9, 16: wider channel tiles, the last one partial), of many (40 x 40; 32 x
// 32 with 3 channels: longer rows), odd and even channel counts below and
// above 64, and more batches than one grid dimension holds (65537).
const Shape kChannelShapes[] = {
    Shape{3, 5, 4, 6},   Shape{2, 7, 3, 4, 5}, Shape{6, 70, 3, 3},  Shape{2, 37, 33},   Shape{1, 1, 65},
    Shape{3, 130, 1, 1}, Shape{2, 192, 4, 4},  Shape{2, 600, 2, 2}, Shape{2, 515, 3},   Shape{2, 66, 40, 40},
    Shape{2, 3, 32, 32}, Shape{2, 16, 5, 7},   Shape{2, 2, 50},     Shape{2, 65, 6, 6}, Shape{65537, 2, 2}};

// A channels-first element's channels-last index.
int64_t last_index(const Shape& first, int64_t i) { return ft::memory_index(first, MemoryFormat::ChannelsLast, i); }

TEST_P(Convert, NarrowChannelsLastMovesDimOneLastAndRounds) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  for (const Format& f : kFormats)
    for (const Shape& first : kChannelShapes) {
      SCOPED_TRACE(std::string(f.name) + " " + first.str());
      Tensor x = Tensor::empty(first);
      for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
      Tensor xd = up(x), ld = up(Tensor::empty(kernels::channels_last_shape(first), f.dtype));
      kernels::narrow_channels_last(ctx(), xd, ld);
      const Tensor l = down(ld);
      ASSERT_EQ(l.shape(), kernels::channels_last_shape(first));
      for (int64_t i = 0; i < x.numel(); ++i)
        ASSERT_EQ(l.data<uint16_t>()[last_index(first, i)], nearest(f, x.f32()[i])) << "element " << i;
    }
}

TEST_P(Convert, WidenChannelsFirstMovesTheLastDimBackAndAdds) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (const Format& f : kFormats)
    for (const Shape& first : kChannelShapes)
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(std::string(f.name) + " " + first.str() + (accumulate ? " +=" : " ="));
        Tensor l = Tensor::empty(kernels::channels_last_shape(first), f.dtype);
        const uint32_t finite = inf_bits(f);  // patterns below it (either sign) are finite
        std::uniform_int_distribution<uint32_t> pattern(0, finite - 1);
        for (int64_t i = 0; i < l.numel(); ++i)
          l.data<uint16_t>()[i] = static_cast<uint16_t>(pattern(rng) | (i % 2 ? 0x8000u : 0u));
        Tensor y = Tensor::empty(first);
        for (int64_t i = 0; i < y.numel(); ++i) y.f32()[i] = u(rng);
        Tensor ld = up(l), yd = up(y);
        kernels::widen_channels_first(ctx(), ld, yd, accumulate);
        const Tensor got = down(yd);
        for (int64_t i = 0; i < y.numel(); ++i) {
          const float v = static_cast<float>(decode(f, l.data<uint16_t>()[last_index(first, i)]));
          const float want = accumulate ? y.f32()[i] + v : v;
          ASSERT_EQ(got.f32()[i], want) << "element " << i;
        }
      }
}

// A logical element's value in a host tensor of any floating type and format.
double logical_value(const Tensor& t, int64_t i) {
  const int64_t at = t.channels_last() ? last_index(t.shape(), i) : i;
  if (t.dtype() == DType::F32) return t.f32()[at];
  const uint16_t h = t.data<uint16_t>()[at];
  return decode(t.dtype() == DType::BF16 ? kFormats[0] : kFormats[1], h);
}

// The pattern (or float32) that stores v in type d: v's nearest.
void store_logical(Tensor& t, int64_t i, float v) {
  const int64_t at = t.channels_last() ? last_index(t.shape(), i) : i;
  if (t.dtype() == DType::F32) t.f32()[at] = v;
  else t.data<uint16_t>()[at] = nearest(t.dtype() == DType::BF16 ? kFormats[0] : kFormats[1], v);
}

TEST_P(Convert, EveryTypeAndFormatToEveryOther) {
  // Values spread over the low types' exponents, with both signs.
  const DType types[] = {DType::F32, DType::BF16, DType::F16};
  const MemoryFormat formats[] = {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast};
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-6.0f, 6.0f);
  for (const Shape& shape : {Shape{3, 5, 4, 6}, Shape{2, 7, 3, 4, 5}, Shape{2, 66, 40, 40}, Shape{2, 3, 1, 1}})
    for (DType sd : types)
      for (DType dd : types)
        for (MemoryFormat sf : formats)
          for (MemoryFormat df : formats) {
            SCOPED_TRACE(shape.str() + " " + dtype_name(sd) + " " + memory_format_name(sf) + " -> " +
                         dtype_name(dd) + " " + memory_format_name(df));
            Tensor x = Tensor::empty(shape, sd, Device::cpu(), sf);
            for (int64_t i = 0; i < x.numel(); ++i)
              store_logical(x, i, u(rng) * std::ldexp(1.0f, static_cast<int>(i % 9) - 4));
            Tensor xd = up(x), yd = up(Tensor::empty(shape, dd, Device::cpu(), df));
            kernels::convert(ctx(), xd, yd);
            const Tensor y = down(yd);
            ASSERT_EQ(y.format(), df);
            Tensor want = Tensor::empty(shape, dd, Device::cpu(), df);
            for (int64_t i = 0; i < x.numel(); ++i) store_logical(want, i, static_cast<float>(logical_value(x, i)));
            for (int64_t i = 0; i < x.numel(); ++i)
              ASSERT_EQ(logical_value(y, i), logical_value(want, i)) << "element " << i;
          }
}

TEST_P(Convert, RefusesOtherTypesAndShapes) {
  Tensor a = up(Tensor::zeros(Shape{4})), b16 = up(Tensor::zeros(Shape{3}, DType::F16));
  Tensor i32 = up(Tensor::zeros(Shape{4}, DType::I32));
  EXPECT_THROW(kernels::convert(ctx(), a, b16), Error);  // numel
  EXPECT_THROW(kernels::convert(ctx(), a, i32), Error);  // not a low-precision type
  EXPECT_THROW(kernels::round_to(ctx(), a, DType::F64), Error);
  // Between formats the logical shapes must match; into itself only as it is.
  Tensor nchw = up(Tensor::zeros(Shape{2, 3, 4, 5})), nhwc = up(Tensor::zeros(Shape{2, 3, 5, 4}, DType::BF16,
                                                                             Device::cpu(), MemoryFormat::ChannelsLast));
  EXPECT_THROW(kernels::convert(ctx(), nchw, nhwc), Error);
  EXPECT_NO_THROW(kernels::convert(ctx(), nchw, nchw));
  Tensor bf = nchw.as(nchw.shape(), DType::BF16);
  EXPECT_THROW(kernels::convert(ctx(), nchw, bf), Error);
  // Channels-last copies: the permuted shape, float32 on the channels-first side, three or more dims.
  Tensor first = up(Tensor::zeros(Shape{2, 3, 4})), last = up(Tensor::zeros(Shape{2, 4, 3}, DType::BF16));
  Tensor same = up(Tensor::zeros(Shape{2, 3, 4}, DType::BF16)), last32 = up(Tensor::zeros(Shape{2, 4, 3}));
  Tensor flat = up(Tensor::zeros(Shape{2, 3})), flat16 = up(Tensor::zeros(Shape{2, 3}, DType::F16));
  EXPECT_THROW(kernels::narrow_channels_last(ctx(), first, same), Error);
  EXPECT_THROW(kernels::narrow_channels_last(ctx(), first, last32), Error);
  EXPECT_THROW(kernels::narrow_channels_last(ctx(), flat, flat16), Error);
  EXPECT_THROW(kernels::widen_channels_first(ctx(), same, first, false), Error);
  EXPECT_THROW(kernels::widen_channels_first(ctx(), last, last32, true), Error);
  EXPECT_NO_THROW(kernels::narrow_channels_last(ctx(), first, last));
  EXPECT_NO_THROW(kernels::widen_channels_first(ctx(), last, first, true));
}

}  // namespace
}  // namespace fanout
