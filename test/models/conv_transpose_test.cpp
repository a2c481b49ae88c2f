// ConvTranspose2d/3d on every backend against torch's definition in float64
// (each input element scatters x * w into the output window it maps to:
// o = i * stride - padding + k), with output_padding, stride 1 to 3, kernels
// 1 to 4; the input, weight and bias gradients of loss = sum(r * y) in
// float64 by the same definition; the per-channel bias kernels alone;
// gradient checks, torch's parameter names and shapes, errors; and a decoder
// with ConvTranspose2d trained on cpu:2 equal to one device bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/conv_bias.h"
#include "models/layers/activation.h"
#include "models/layers/conv.h"
#include "models/layers/conv_transpose.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/sequential.h"
#include "runtime/core/error.h"
#include "runtime/nn/grad_check.h"
#include "runtime/parallel/engine_factory.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

struct Case {
  int dims;
  Shape x;
  int64_t out, k, stride, pad, out_pad;
  bool bias;
};

// y, dx, dw, db of the definition in float64 (x, w, b, r on the host).
struct Reference {
  std::vector<double> y, dx, dw, db;
};
Reference reference(const Case& c, const Shape& ys, const Tensor& x, const Tensor& w, const Tensor* b,
                    const Tensor& r) {
  Reference ref;
  ref.y.assign(ys.numel(), 0.0);
  ref.dx.assign(x.numel(), 0.0);
  ref.dw.assign(w.numel(), 0.0);
  ref.db.assign(c.out, 0.0);
  const int64_t n = c.x[0], cin = c.x[1], k = c.k;
  const int64_t id = c.dims == 3 ? c.x[2] : 1, ih = c.x[c.dims == 3 ? 3 : 2], iw = c.x[c.dims == 3 ? 4 : 3];
  const int64_t od = c.dims == 3 ? ys[2] : 1, oh = ys[c.dims == 3 ? 3 : 2], ow = ys[c.dims == 3 ? 4 : 3];
  const int64_t kd = c.dims == 3 ? k : 1;
  auto yi = [&](int64_t b_, int64_t co, int64_t a, int64_t h, int64_t w_) { return (((b_ * c.out + co) * od + a) * oh + h) * ow + w_; };
  for (int64_t b_ = 0; b_ < n; ++b_)
    for (int64_t ci = 0; ci < cin; ++ci)
      for (int64_t a = 0; a < id; ++a)
        for (int64_t h = 0; h < ih; ++h)
          for (int64_t q = 0; q < iw; ++q) {
            const int64_t xi = (((b_ * cin + ci) * id + a) * ih + h) * iw + q;
            for (int64_t co = 0; co < c.out; ++co)
              for (int64_t ka = 0; ka < kd; ++ka)
                for (int64_t kh = 0; kh < k; ++kh)
                  for (int64_t kw = 0; kw < k; ++kw) {
                    const int64_t oa = c.dims == 3 ? a * c.stride - c.pad + ka : 0;
                    const int64_t oy = h * c.stride - c.pad + kh, ox = q * c.stride - c.pad + kw;
                    if (oa < 0 || oa >= od || oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
                    const int64_t wi = (((ci * c.out + co) * kd + ka) * k + kh) * k + kw;
                    const int64_t o = yi(b_, co, oa, oy, ox);
                    ref.y[o] += double(x.f32()[xi]) * w.f32()[wi];
                    ref.dx[xi] += double(r.f32()[o]) * w.f32()[wi];
                    ref.dw[wi] += double(r.f32()[o]) * x.f32()[xi];
                  }
          }
  const int64_t plane = od * oh * ow;
  for (int64_t b_ = 0; b_ < n; ++b_)
    for (int64_t co = 0; co < c.out; ++co)
      for (int64_t s = 0; s < plane; ++s) {
        const int64_t o = (b_ * c.out + co) * plane + s;
        if (b) ref.y[o] += b->f32()[co];
        ref.db[co] += r.f32()[o];
      }
  return ref;
}

FANOUT_BACKEND_SUITE(ConvTransposeOnBackend);

TEST_P(ConvTransposeOnBackend, ForwardBackwardAgainstFloat64) {
  const Case cases[] = {
      {2, Shape{2, 3, 5, 4}, 4, 3, 2, 1, 1, true},  {2, Shape{1, 2, 3, 3}, 3, 4, 2, 1, 0, true},
      {2, Shape{2, 4, 6, 5}, 2, 1, 1, 0, 0, false}, {2, Shape{1, 3, 4, 4}, 2, 2, 3, 0, 2, true},
      {3, Shape{2, 2, 3, 4, 3}, 3, 3, 2, 1, 1, true}, {3, Shape{1, 3, 2, 2, 2}, 2, 2, 2, 0, 0, false},
  };
  std::mt19937_64 rng(501);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.x.str() + " k" + std::to_string(c.k) + " s" + std::to_string(c.stride) + " p" +
                 std::to_string(c.pad) + " op" + std::to_string(c.out_pad));
    models::ConvTranspose m(c.dims, c.x[1], c.out, c.k, c.stride, c.pad, c.out_pad, c.bias);
    m.init(7);
    m.set_input_grad(true);
    const Tensor w = m.named_parameters()[0].second->value.to(Device::cpu());
    const Tensor b = c.bias ? m.named_parameters()[1].second->value.to(Device::cpu()) : Tensor();
    m.to(dev());
    Tensor x = ft::random_tensor(c.x, rng);
    const Shape ys = m.output_shape(c.x);
    Tensor r = ft::random_tensor(ys, rng);
    const Reference want = reference(c, ys, x, w, c.bias ? &b : nullptr, r);
    m.zero_grad();
    const Tensor y = down(m.forward(up(x), ctx()));
    ASSERT_EQ(y.shape(), ys);
    EXPECT_TRUE(matches(y, want.y, 1e-5, 1e-4));
    const Tensor dx = down(m.backward(up(r), ctx()));
    EXPECT_TRUE(matches(dx, want.dx, 1e-5, 1e-4));
    const Tensor grads = down(m.arenas().grads);
    const auto ps = m.named_parameters();
    EXPECT_TRUE(matches(grads.flat(ps[0].second->offset, ps[0].second->shape).to(Device::cpu()), want.dw, 1e-5, 1e-4));
    if (c.bias) EXPECT_TRUE(matches(grads.flat(ps[1].second->offset, Shape{c.out}).to(Device::cpu()), want.db, 1e-5, 1e-4));
    EXPECT_GT(ft::l2_norm(dx), 0.0);
  }
}

TEST_P(ConvTransposeOnBackend, ChannelBiasKernels) {
  std::mt19937_64 rng(502);
  Tensor y = ft::random_tensor(Shape{3, 4, 5, 2}, rng), b = ft::random_tensor(Shape{4}, rng);
  Tensor yd = up(y);
  kernels::channel_bias_add(ctx(), yd, up(b));
  const Tensor got = down(yd);
  std::vector<double> want(y.numel()), db(4, 0.5);
  for (int64_t i = 0; i < y.numel(); ++i) {
    want[i] = double(y.f32()[i]) + b.f32()[(i / 10) % 4];
    db[(i / 10) % 4] += y.f32()[i];
  }
  EXPECT_TRUE(matches(got, want, 1e-6, 1e-6));
  Tensor dbd = up(Tensor::empty(Shape{4}));
  Tensor half = Tensor::empty(Shape{4});
  half.fill(0.5f);
  dbd = up(half);
  kernels::channel_bias_grad(ctx(), up(y), dbd);
  EXPECT_TRUE(matches(down(dbd), db, 1e-6, 1e-6));
}

TEST(ConvTransposeLayer, GradientsParameterNamesAndErrors) {
  models::ConvTranspose two(2, 3, 4, 3, 2, 1, 1);
  const auto ps = two.named_parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].first, "weight");
  EXPECT_EQ(ps[0].second->shape, (Shape{3, 4, 3, 3})) << "torch's (in, out, k, k)";
  EXPECT_EQ(ps[1].first, "bias");
  EXPECT_EQ(two.output_shape(Shape{2, 3, 5, 4}), (Shape{2, 4, 10, 8}));  // (5 - 1) * 2 - 2 + 3 + 1
  GradCheck g = check_gradients(two, Shape{2, 3, 4, 3}, 3);
  EXPECT_LT(g.worst(), 1e-2) << g.report();
  models::ConvTranspose three(3, 2, 3, 2, 2);
  EXPECT_EQ(three.type_name(), "ConvTranspose3d");
  g = check_gradients(three, Shape{1, 2, 2, 3, 2}, 4);
  EXPECT_LT(g.worst(), 1e-2) << g.report();
  ft::expect_user_error([] { models::ConvTranspose(2, 3, 4, 3, 2, 0, 2); }, {"output_padding 2 must be smaller than the stride 2"});
  two.init(1);
  Context ctx(Device::cpu());
  ft::expect_user_error([&] { two.forward(Tensor::zeros(Shape{2, 5, 4, 4}), ctx); },
                        {"ConvTranspose2d(3, 4, kernel 3, stride 2, padding 1) cannot take input of shape (2, 5, 4, 4)"});
}

// A small decoder: Linear to (4, 4, 4), ConvTranspose2d up to 8x8, Conv2d, Linear.
std::unique_ptr<Module> decoder() {
  auto m = std::make_unique<models::Sequential>();
  m->add("down", std::make_unique<models::Conv2d>(1, 4, 3, 2, 1));  // 8x8 -> 4x4
  m->add("relu1", std::make_unique<models::ReLU>());
  m->add("up", std::make_unique<models::ConvTranspose>(2, 4, 3, 4, 2, 1));  // 4x4 -> 8x8
  m->add("relu2", std::make_unique<models::ReLU>());
  m->add("flatten", std::make_unique<models::Flatten>());
  m->add("fc", std::make_unique<models::Linear>(3 * 8 * 8, 10));
  m->init(8);
  return m;
}

TEST(ConvTransposeLayer, DataParallelEqualsOneDevice) {
  const auto data = ft::random_batches(Shape{1, 8, 8}, 12, 8, 31);
  auto train = [&](const std::string& devices) { return ft::trained_params(*decoder(), devices, data); };
  const Tensor one = train("cpu");
  EXPECT_GT(ft::max_rel_diff(one, decoder()->arenas().params), 1e-3) << "training moved the parameters";
  for (const char* d : {"cpu:2", "cpu:3"}) EXPECT_TRUE(ft::same_bits(train(d), one)) << d;
}

}  // namespace
}  // namespace fanout
