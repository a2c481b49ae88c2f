// Mixed precision on CPU devices: a bf16-mixed (and 16-mixed) step's
// gradients (a linear net's and a convolutional one's) equal a float64 reference that rounds to the low type at the
// points runtime/nn/autocast.h documents; loss scaling skips a step whose
// gradients overflow (parameters untouched, scale halved) and grows the
// scale after its interval of finite steps; the mixed step allocates
// nothing once warm on one device and on DataParallel.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/plan_count.h"
#include "models/layers/activation.h"
#include "models/layers/conv.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "cuda/target_batch.h"
#include "models/zoo/zoo.h"
#include "runtime/core/half.h"
#include "runtime/core/memory.h"
#include "runtime/optim/grad_scaler.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

// float32 value rounded to t (BF16 or F16), as a double.
double low(double v, DType t) {
  const float f = static_cast<float>(v);
  return t == DType::BF16 ? half::float_from_bf16(half::bf16_from_float(f))
                          : half::float_from_f16(half::f16_from_float(f));
}

using Mat = std::vector<std::vector<double>>;
Mat mat(const Tensor& t, int64_t rows, int64_t cols) {
  Mat m(rows, std::vector<double>(cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m[i][j] = t.f32()[i * cols + j];
  return m;
}

struct Grads {
  Mat w1, w2;
  std::vector<double> b1, b2;
};

// Linear(I, H) -> ReLU -> Linear(H, C) -> mean cross-entropy, by the
// formulas in float64, rounding to `t` where autocast.h says.
Grads reference(const Tensor& xt, const Tensor& yt, Module& m, DType t) {
  const int64_t n = xt.size(0), in = xt.size(1);
  auto ps = m.named_parameters();  // 0.weight, 0.bias, 2.weight, 2.bias
  const int64_t h = ps[0].second->shape[0], c = ps[2].second->shape[0];
  auto r = [t](double v) { return low(v, t); };
  Mat x = mat(xt, n, in), w1 = mat(ps[0].second->value, h, in), w2 = mat(ps[2].second->value, c, h);
  std::vector<double> b1(h), b2(c);
  for (int64_t j = 0; j < h; ++j) b1[j] = r(ps[1].second->value.f32()[j]);
  for (int64_t j = 0; j < c; ++j) b2[j] = r(ps[3].second->value.f32()[j]);
  for (auto& row : x) for (auto& v : row) v = r(v);
  for (auto& row : w1) for (auto& v : row) v = r(v);
  for (auto& row : w2) for (auto& v : row) v = r(v);
  Mat a(n, std::vector<double>(h)), z(n, std::vector<double>(c)), dz = z, da = a;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < h; ++j) {
      double s = b1[j];
      for (int64_t k = 0; k < in; ++k) s += x[i][k] * w1[j][k];
      a[i][j] = std::max(0.0, r(s));  // fc1's output in the low type, then ReLU
    }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      double s = b2[j];
      for (int64_t k = 0; k < h; ++k) s += a[i][k] * w2[j][k];
      z[i][j] = r(s);
    }
    // softmax cross-entropy in float32 on the low-type logits; its gradient rounded to the low type
    double mx = z[i][0], sum = 0;
    for (double v : z[i]) mx = std::max(mx, v);
    for (double v : z[i]) sum += std::exp(v - mx);
    for (int64_t j = 0; j < c; ++j) {
      const double p = std::exp(z[i][j] - mx) / sum;
      dz[i][j] = r((p - (j == yt.data<int32_t>()[i] ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  Grads g{Mat(h, std::vector<double>(in)), Mat(c, std::vector<double>(h)), std::vector<double>(h),
          std::vector<double>(c)};
  // A linear layer's weight and bias gradients from its output gradient and input, rounded.
  auto weight_grads = [&](const Mat& dout, const Mat& input, Mat& gw, std::vector<double>& gb) {
    for (size_t j = 0; j < gb.size(); ++j) {
      double sb = 0;
      for (int64_t i = 0; i < n; ++i) sb += dout[i][j];
      gb[j] = r(sb);
      for (size_t k = 0; k < gw[j].size(); ++k) {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += dout[i][j] * input[i][k];
        gw[j][k] = r(s);
      }
    }
  };
  weight_grads(dz, a, g.w2, g.b2);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < h; ++k) {
      double s = 0;
      for (int64_t j = 0; j < c; ++j) s += dz[i][j] * w2[j][k];
      da[i][k] = a[i][k] > 0 ? r(s) : 0.0;  // fc2's dx in the low type, masked by ReLU
    }
  weight_grads(da, x, g.w1, g.b1);
  return g;
}

std::unique_ptr<Module> two_layer(int64_t in, int64_t hidden, int64_t classes) {
  auto m = std::make_unique<models::Sequential>();
  m->add(std::make_unique<models::Linear>(in, hidden));
  m->add(std::make_unique<models::ReLU>(/*inplace=*/true));
  m->add(std::make_unique<models::Linear>(hidden, classes));
  m->init(3);
  return m;
}

// How many of the gradient's elements equal the reference exactly, and the
// largest difference in units of the low type's spacing at the reference.
struct Agreement {
  int64_t equal = 0, total = 0;
  double worst_ulps = 0;
};
void compare(const Tensor& got, const std::vector<double>& want, DType t, Agreement& a) {
  const double bits = t == DType::BF16 ? 8 : 11;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got.f32()[i];
    ++a.total;
    if (g == want[i]) {
      ++a.equal;
      continue;
    }
    const double spacing = std::ldexp(1.0, std::ilogb(std::max(std::abs(want[i]), 1e-30)) - static_cast<int>(bits) + 1);
    a.worst_ulps = std::max(a.worst_ulps, std::abs(g - want[i]) / spacing);
  }
}
std::vector<double> flat(const Mat& m) {
  std::vector<double> v;
  for (auto& row : m) v.insert(v.end(), row.begin(), row.end());
  return v;
}

// One step of m on (x, y) on a CPU device under autocast to engine_type:
// each parameter's gradient, in order, against want's, rounded to
// reference_type.
Agreement step_grads_against(Module& m, const Tensor& x, const Tensor& y, DType engine_type,
                             const std::vector<std::vector<double>>& want, DType reference_type) {
  MathOptions math;
  math.autocast = engine_type;
  SingleDeviceEngine eng(m, Device::cpu(), *make_criterion({}), 1, math);
  eng.forward_backward_batch(x, y);
  auto ps = m.named_parameters();
  Agreement a;
  for (size_t i = 0; i < want.size(); ++i) compare(ps[i].second->grad, want[i], reference_type, a);
  return a;
}

Agreement step_against_reference(DType engine_type, DType reference_type) {
  auto m = two_layer(24, 32, 6);
  std::mt19937_64 rng(7);
  Tensor x = testing::random_tensor(Shape{16, 24}, rng, -2.0f, 2.0f);
  Tensor y = testing::random_labels(16, 6, rng);
  const Grads want = reference(x, y, *m, reference_type);
  return step_grads_against(*m, x, y, engine_type, {flat(want.w1), want.b1, flat(want.w2), want.b2}, reference_type);
}

class MixedStep : public ::testing::TestWithParam<DType> {};
FANOUT_LOW_TYPE_SUITE(MixedStep);

// The reference sums in float64, the kernels in float32: a sum within a few
// float32 ulps of a rounding boundary of the low type may round the other
// way (rare: about 2^-13 of the elements for bfloat16), so the test asks
// for at least 99% of the elements equal and none farther than one spacing.
void expect_rounded_reference(const char* net, Agreement (*step)(DType engine_type, DType reference_type), DType t) {
  const Agreement a = step(t, t);
  std::printf("%s %s: %lld of %lld gradient elements equal the reference, worst %.2f spacings\n", net, dtype_name(t),
              static_cast<long long>(a.equal), static_cast<long long>(a.total), a.worst_ulps);
  EXPECT_GE(a.equal, a.total * 99 / 100);
  EXPECT_LE(a.worst_ulps, 1.0);
  // The comparison can fail: float32's gradients match the low-type reference in few elements.
  const Agreement f32 = step(DType::F32, t);
  EXPECT_LT(f32.equal, f32.total / 2) << "float32 gradients should not match the rounded reference";
}

TEST_P(MixedStep, GradientsEqualTheRoundedFloat64Reference) {
  expect_rounded_reference("linear", step_against_reference, GetParam());
}

// Conv2d(C, O, 3, padding 1) -> ReLU -> Flatten -> Linear(O H W, K) -> mean
// cross-entropy, by the formulas in float64, rounding to `t` where
// autocast.h says (the CPU rounds a convolution's output once, after its
// bias). Returns the gradients in the parameters' order.
std::vector<std::vector<double>> conv_reference(const Tensor& xt, const Tensor& yt, Module& m, DType t) {
  const int64_t n = xt.size(0), c = xt.size(1), hh = xt.size(2), ww = xt.size(3);
  auto ps = m.named_parameters();  // 0.weight, 0.bias, 3.weight, 3.bias
  const int64_t o = ps[0].second->shape[0], k = ps[2].second->shape[0], f = o * hh * ww;
  auto r = [t](double v) { return low(v, t); };
  auto rounded = [&](const Tensor& v) {
    std::vector<double> out(static_cast<size_t>(v.numel()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = r(v.f32()[i]);
    return out;
  };
  const std::vector<double> x = rounded(xt), w = rounded(ps[0].second->value), b = rounded(ps[1].second->value),
                            v = rounded(ps[2].second->value), vb = rounded(ps[3].second->value);
  auto xi = [&](int64_t i, int64_t ch, int64_t y, int64_t z) { return x[((i * c + ch) * hh + y) * ww + z]; };
  auto wi = [&](int64_t oc, int64_t ch, int64_t dy, int64_t dz) { return w[((oc * c + ch) * 3 + dy) * 3 + dz]; };
  // Each output position's input taps inside the image: (ch, dy, dz) with y + dy - 1, z + dz - 1 inside.
  auto each_tap = [&](int64_t y, int64_t z, auto&& fn) {
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t dy = 0; dy < 3; ++dy)
        for (int64_t dz = 0; dz < 3; ++dz) {
          const int64_t sy = y + dy - 1, sz = z + dz - 1;
          if (sy >= 0 && sy < hh && sz >= 0 && sz < ww) fn(ch, dy, dz, sy, sz);
        }
  };
  std::vector<double> a(static_cast<size_t>(n * f)), dz(static_cast<size_t>(n * k)), da(a.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < hh; ++y)
        for (int64_t z = 0; z < ww; ++z) {
          double s = 0;
          each_tap(y, z, [&](int64_t ch, int64_t dy, int64_t dz2, int64_t sy, int64_t sz) {
            s += xi(i, ch, sy, sz) * wi(oc, ch, dy, dz2);
          });
          a[i * f + (oc * hh + y) * ww + z] = std::max(0.0, r(s + b[oc]));  // conv output low, then ReLU
        }
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> logits(k);
    for (int64_t j = 0; j < k; ++j) {
      double s = vb[j];
      for (int64_t q = 0; q < f; ++q) s += a[i * f + q] * v[j * f + q];
      logits[j] = r(s);
    }
    double mx = logits[0], sum = 0;
    for (double l : logits) mx = std::max(mx, l);
    for (double l : logits) sum += std::exp(l - mx);
    for (int64_t j = 0; j < k; ++j) {
      const double p = std::exp(logits[j] - mx) / sum;
      dz[i * k + j] = r((p - (j == yt.data<int32_t>()[i] ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  std::vector<double> gw(w.size()), gb(b.size()), gv(v.size()), gvb(vb.size());
  for (int64_t j = 0; j < k; ++j) {
    double sb = 0;
    for (int64_t i = 0; i < n; ++i) sb += dz[i * k + j];
    gvb[j] = r(sb);
    for (int64_t q = 0; q < f; ++q) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += dz[i * k + j] * a[i * f + q];
      gv[j * f + q] = r(s);
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t q = 0; q < f; ++q) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += dz[i * k + j] * v[j * f + q];
      da[i * f + q] = a[i * f + q] > 0 ? r(s) : 0.0;  // the linear layer's dx in the low type, masked by ReLU
    }
  for (int64_t oc = 0; oc < o; ++oc) {
    double sb = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t y = 0; y < hh; ++y)
        for (int64_t z = 0; z < ww; ++z) {
          const double d = da[i * f + (oc * hh + y) * ww + z];
          sb += d;
          each_tap(y, z, [&](int64_t ch, int64_t dy, int64_t dz2, int64_t sy, int64_t sz) {
            gw[((oc * c + ch) * 3 + dy) * 3 + dz2] += d * xi(i, ch, sy, sz);
          });
        }
    gb[oc] = r(sb);
  }
  for (double& g : gw) g = r(g);
  return {gw, gb, gv, gvb};
}

Agreement conv_step_against_reference(DType engine_type, DType reference_type) {
  const int64_t c = 3, o = 4, hw = 6, k = 5;
  auto m = std::make_unique<models::Sequential>();
  m->add(std::make_unique<models::Conv2d>(c, o, 3, 1, 1));
  m->add(std::make_unique<models::ReLU>(/*inplace=*/true));
  m->add(std::make_unique<models::Flatten>());
  m->add(std::make_unique<models::Linear>(o * hw * hw, k));
  m->init(5);
  std::mt19937_64 rng(11);
  Tensor x = testing::random_tensor(Shape{8, c, hw, hw}, rng, -2.0f, 2.0f);
  Tensor y = testing::random_labels(8, k, rng);
  return step_grads_against(*m, x, y, engine_type, conv_reference(x, y, *m, reference_type), reference_type);
}

// The same bounds for a convolutional net.
TEST_P(MixedStep, ConvolutionGradientsEqualTheRoundedFloat64Reference) {
  expect_rounded_reference("convolutional", conv_step_against_reference, GetParam());
}

// Under autocast a layer's output is a low-type tensor, and so is its
// gradient: Linear's dx comes from dy rounded to bfloat16, not from the
// float32 dy it is handed (dy here is not bfloat16-exact).
TEST(MixedPrecision, LinearTakesItsOutputGradientInTheLowType) {
  auto m = std::make_unique<models::Sequential>();
  auto& fc = m->add(std::make_unique<models::Linear>(5, 3));
  m->set_input_grad(true);
  m->init(3);
  Context ctx(Device::cpu());
  ctx.math.autocast = DType::BF16;
  std::mt19937_64 rng(9);
  const Tensor x = testing::random_tensor(Shape{4, 5}, rng), dy = testing::random_tensor(Shape{4, 3}, rng);
  fc.forward(x, ctx);
  const Tensor dx = fc.backward(testing::clone(dy), ctx);
  const Tensor& w = m->named_parameters()[0].second->value;  // (3, 5)
  int equal = 0, unrounded_differs = 0;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t k = 0; k < 5; ++k) {
      double s = 0, s_unrounded = 0;
      for (int64_t j = 0; j < 3; ++j) {
        const double wj = low(w.f32()[j * 5 + k], DType::BF16);
        s += low(dy.f32()[i * 3 + j], DType::BF16) * wj;
        s_unrounded += dy.f32()[i * 3 + j] * wj;
      }
      const double want = low(s, DType::BF16), got = dx.f32()[i * 5 + k];
      equal += got == want;
      unrounded_differs += low(s_unrounded, DType::BF16) != want;
      EXPECT_LE(std::abs(got - want), std::ldexp(std::abs(want), -7)) << i << ", " << k;
    }
  EXPECT_GE(equal, 18) << "of 20";
  EXPECT_GE(unrounded_differs, 3) << "the test must tell a rounded dy from a float32 one";
}

// Float16 with loss scaling on lenet.
struct Scaled {
  std::unique_ptr<Module> model;
  testing::Trained<SingleDeviceEngine> eng;
  Tensor x, y;
  explicit Scaled(std::unique_ptr<Module> m)
      : model(std::move(m)), eng(*model, Device::cpu(), *make_criterion({}), 1, f16_math()) {
    std::mt19937_64 rng(11);
    x = testing::random_tensor(Shape{8, 1, 28, 28}, rng);
    y = testing::random_labels(8, 10, rng);
  }
  static MathOptions f16_math() {
    MathOptions m;
    m.autocast = DType::F16;
    return m;
  }
  bool step(optim::GradScaler& s) {
    train::train_step(eng, eng.optimizer(), x, y, 0.05f, 0, 0, &s);
    return s.growth_tracker() > 0 || s.skipped() == 0;
  }
};

TEST(LossScaling, AnOverflowingStepIsSkippedAndTheScaleBacksOff) {
  Scaled s(models::make_model("lenet", Shape{1, 28, 28}, 10, 2));
  optim::GradScalerOptions o;
  o.init_scale = std::ldexp(1.0f, 100);  // the scaled loss gradient overflows float16
  optim::GradScaler scaler(o);
  const Tensor before = s.model->arenas().params.to(Device::cpu());
  s.step(scaler);
  EXPECT_EQ(scaler.skipped(), 1);
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0f, 99));
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(s.eng.optimizer().steps(), 0);
  EXPECT_TRUE(testing::same_bits(s.model->arenas().params, before)) << "a skipped step leaves the parameters alone";
  EXPECT_EQ(testing::l2_norm(s.model->arenas().grads), 0.0) << "and clears the gradients";
}

TEST(LossScaling, TheScaleGrowsAfterItsIntervalOfFiniteSteps) {
  Scaled s(models::make_model("lenet", Shape{1, 28, 28}, 10, 2));
  optim::GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  optim::GradScaler scaler(o);
  const Tensor before = s.model->arenas().params.to(Device::cpu());
  for (int i = 0; i < 2; ++i) s.step(scaler);
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  s.step(scaler);
  EXPECT_EQ(scaler.scale(), 2048.0f);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.skipped(), 0);
  EXPECT_EQ(s.eng.optimizer().steps(), 3);
  EXPECT_FALSE(testing::same_bits(s.model->arenas().params, before));
}

// Scaling is what keeps small float16 gradients: unscaled, the same step's
// gradients lose elements to underflow that the scaled step keeps.
TEST(LossScaling, ScalingKeepsGradientsThatFloat16Flushes) {
  auto count_nonzero = [](const Tensor& g) {
    int64_t n = 0;
    for (int64_t i = 0; i < g.numel(); ++i) n += g.f32()[i] != 0.0f;
    return n;
  };
  auto grads_with_scale = [&](float scale) {
    Scaled s(models::make_model("lenet", Shape{1, 28, 28}, 10, 2));
    s.eng.forward_backward(s.x, s.y, scale / 8.0f, true);
    return count_nonzero(s.model->arenas().grads);
  };
  const int64_t unscaled = grads_with_scale(1.0f), scaled = grads_with_scale(65536.0f);
  std::printf("non-zero gradient elements: %lld unscaled, %lld scaled by 2^16\n", static_cast<long long>(unscaled),
              static_cast<long long>(scaled));
  EXPECT_GT(scaled, unscaled);
}

TEST(MixedPrecision, SteadyStateAllocatesNothing) {
  for (const char* devices : {"cpu", "cpu:2"}) {
    SCOPED_TRACE(devices);
    const Shape sample{3, 16, 16};
    auto m = models::make_model("cnn", sample, 10, 1);  // convolutions, BatchNorm, pooling, linear
    DataParallelOptions opts;
    opts.math.autocast = DType::BF16;
    testing::Trained<DataParallelEngine> eng(*m, parse_devices(devices), *make_criterion({}), opts);
    auto batches = testing::random_batches(sample, 12, 2, 7);
    for (auto& b : batches) eng.train_step(b.x, b.y, 0.05f);
    for (auto& b : batches) eng.eval_step(b.x, b.y);
    const auto before = alloc_stats();
    const uint64_t plans = kernels::cpu::onednn_plans_made();
    for (int rep = 0; rep < 2; ++rep) {
      for (auto& b : batches) eng.train_step(b.x, b.y, 0.05f);
      for (auto& b : batches) eng.eval_step(b.x, b.y);
    }
    EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
    EXPECT_EQ(kernels::cpu::onednn_plans_made(), plans);
  }
}

}  // namespace
}  // namespace fanout
