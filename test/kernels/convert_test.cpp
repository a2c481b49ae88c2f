// Precision conversions on every backend against a reference built from the
// bit patterns alone (each pattern decoded by its formula in double; a
// float32 rounds to the nearer of two neighbouring patterns, the even one on
// a tie, to infinity past the largest finite value plus half its spacing):
// every bfloat16 and float16 pattern widened and narrowed back; midpoints,
// their float32 neighbours and the values just inside each pair for every
// pair of neighbours (subnormals, ties, overflow); NaN and the sign of zero.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/convert.h"
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

TEST_P(Convert, RefusesOtherTypesAndShapes) {
  Tensor a = up(Tensor::zeros(Shape{4})), b16 = up(Tensor::zeros(Shape{3}, DType::F16));
  Tensor i32 = up(Tensor::zeros(Shape{4}, DType::I32));
  EXPECT_THROW(kernels::convert(ctx(), a, b16), Error);  // numel
  EXPECT_THROW(kernels::convert(ctx(), a, i32), Error);  // not a low-precision type
  EXPECT_THROW(kernels::round_to(ctx(), a, DType::F64), Error);
}

}  // namespace
}  // namespace fanout
