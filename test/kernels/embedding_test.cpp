// Embedding on every backend against float64 references: forward rows (the
// table's bits), backward's scatter-add (+=) with repeated ids (one id
// taking most positions, a vocabulary of one), ids of one to four dims,
// float64 dweight summed per sample (CPU, split-invariant), backward's
// bits independent of the order of equal ids' work, bad ids (one line naming
// the position; NaN rows on CUDA) and argument
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_test_util.h"
#include "kernels/embedding.h"
#include "runtime/core/error.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// Ids in [0, v); with `hot` >= 0 about 80% of them are `hot`.
Tensor random_ids(const Shape& s, int v, std::mt19937_64& rng, int hot = -1) {
  Tensor t = Tensor::empty(s, DType::I32);
  std::uniform_int_distribution<int> u(0, v - 1);
  std::bernoulli_distribution coin(0.8);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = hot >= 0 && coin(rng) ? hot : u(rng);
  return t;
}

Shape rows_shape(const Tensor& ids, int64_t e) {
  Shape s = ids.shape();
  s.d[static_cast<size_t>(s.ndim++)] = e;
  return s;
}

// dweight0 + the scatter-add of dy's rows by id, in float64.
std::vector<double> backward_reference(const Tensor& ids, const Tensor& dy, const Tensor& dweight0) {
  const int64_t e = dweight0.size(1);
  std::vector<double> want(static_cast<size_t>(dweight0.numel()));
  for (int64_t i = 0; i < dweight0.numel(); ++i) want[static_cast<size_t>(i)] = dweight0.f32()[i];
  for (int64_t p = 0; p < ids.numel(); ++p)
    for (int64_t k = 0; k < e; ++k)
      want[static_cast<size_t>(ids.data<int32_t>()[p] * e + k)] += dy.f32()[p * e + k];
  return want;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& err) {
    return err.what();
  }
  return "(no error)";
}

FANOUT_BACKEND_SUITE(EmbeddingOnBackend);

TEST_P(EmbeddingOnBackend, ForwardBackwardAgainstFloat64) {
  struct Case {
    Shape ids;
    int v;
    int64_t e;
    int hot;  // the id most positions take, or -1
  };
  const Case cases[] = {{Shape{3, 37}, 50, 19, -1},  {Shape{1000}, 7, 130, -1},     {Shape{2, 3, 5}, 1, 33, -1},
                        {Shape{517}, 11, 129, 3},    {Shape{4, 129}, 1000, 67, 999}, {Shape{2, 2, 3, 5}, 13, 1, 0},
                        {Shape{1}, 5, 257, -1}};
  std::mt19937_64 rng(91);
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.ids.str() + " over (" + std::to_string(cs.v) + ", " + std::to_string(cs.e) + ")");
    Tensor ids = random_ids(cs.ids, cs.v, rng, cs.hot);
    const Shape rows = rows_shape(ids, cs.e);
    Tensor w = ft::random_tensor(Shape{cs.v, cs.e}, rng, -2.0f, 2.0f), dy = ft::random_tensor(rows, rng);
    Tensor dw0 = ft::random_tensor(Shape{cs.v, cs.e}, rng);  // += onto this
    Tensor idd = up(ids), wd = up(w), dyd = up(dy), dwd = up(dw0), yd = poisoned(rows);
    kernels::embedding_forward(ctx(), idd, wd, yd);
    kernels::embedding_backward(ctx(), idd, dyd, dwd);
    // Forward copies: the table's bits.
    Tensor y = down(yd);
    for (int64_t p = 0; p < ids.numel(); ++p)
      for (int64_t k = 0; k < cs.e; ++k)
        ASSERT_EQ(y.f32()[p * cs.e + k], w.f32()[ids.data<int32_t>()[p] * cs.e + k]) << "position " << p;
    EXPECT_GT(ft::l2_norm(y), 0.0);
    const Tensor dw = down(dwd);
    EXPECT_TRUE(matches(dw, backward_reference(ids, dy, dw0), 1e-5, 1e-5));
    // The sums added: not the starting values.
    Tensor moved = ft::clone(dw);
    for (int64_t i = 0; i < moved.numel(); ++i) moved.f32()[i] -= dw0.f32()[i];
    EXPECT_GT(ft::l2_norm(moved), 0.0);
    // Again: the same bits (no order of work changes a sum).
    Tensor dw2 = up(dw0);
    kernels::embedding_backward(ctx(), idd, dyd, dw2);
    EXPECT_TRUE(ft::same_bits(down(dw2), dw));
  }
}

// Each id's rows are summed in position order in double, then added: with
// rows that cancel (1e8, small ones, then -1e8) a float running sum would lose the
// small values.
TEST_P(EmbeddingOnBackend, RepeatedIdSumsInDouble) {
  const int64_t n = 301, e = 3;
  std::vector<int32_t> idv(static_cast<size_t>(n), 2);
  Tensor ids = ft::i32_values(idv), dy = Tensor::empty(Shape{n, e});
  std::vector<double> sum(static_cast<size_t>(e), 0.0);
  for (int64_t p = 0; p < n; ++p)
    for (int64_t k = 0; k < e; ++k) {
      const float v = p == 0 ? 1e8f : p == n - 1 ? -1e8f : 0.25f + 0.001f * static_cast<float>(k);
      dy.f32()[p * e + k] = v;
      sum[static_cast<size_t>(k)] += v;
    }
  Tensor idd = up(ids), dyd = up(dy), dwd = up(Tensor::zeros(Shape{4, e}));
  kernels::embedding_backward(ctx(), idd, dyd, dwd);
  const Tensor dw = down(dwd);
  for (int64_t k = 0; k < e; ++k) {
    EXPECT_EQ(dw.f32()[2 * e + k], static_cast<float>(sum[static_cast<size_t>(k)])) << "column " << k;
    EXPECT_EQ(dw.f32()[k], 0.0f);
  }
}

TEST_P(EmbeddingOnBackend, BadIdIsOneLineNamingItsPosition) {
  std::mt19937_64 rng(92);
  for (int32_t bad : {57, -1}) {
    SCOPED_TRACE(bad);
    Tensor ids = random_ids(Shape{3, 7}, 10, rng);
    ids.data<int32_t>()[13] = bad;  // batch row 1
    Tensor w = ft::random_tensor(Shape{10, 5}, rng), dy = ft::random_tensor(Shape{3, 7, 5}, rng);
    Tensor idd = up(ids), wd = up(w), dyd = up(dy), yd = poisoned(Shape{3, 7, 5});
    const std::string want = "embedding_forward: id " + std::to_string(bad) +
                             " at batch row 1, position 6 is outside the vocabulary [0, 10)";
    if (!on_cuda()) {
      EXPECT_EQ(error_of([&] { kernels::embedding_forward(ctx(), idd, wd, yd); }), want);
      Tensor dwd = up(Tensor::zeros(Shape{10, 5}));
      const std::string got = error_of([&] { kernels::embedding_backward(ctx(), idd, dyd, dwd); });
      EXPECT_EQ(got.find('\n'), std::string::npos) << got;
      EXPECT_NE(got.find("embedding_backward: id " + std::to_string(bad) + " at batch row 1, position 6"), std::string::npos)
          << got;
      continue;
    }
    // CUDA: NaN rows for the bad id; backward skips it.
    kernels::embedding_forward(ctx(), idd, wd, yd);
    const Tensor y = down(yd);
    for (int64_t p = 0; p < 21; ++p)
      for (int64_t k = 0; k < 5; ++k) {
        const float got = y.f32()[p * 5 + k];
        if (p == 13)
          EXPECT_TRUE(std::isnan(got));
        else
          EXPECT_EQ(got, w.f32()[ids.data<int32_t>()[p] * 5 + k]);
      }
    Tensor dw0 = ft::random_tensor(Shape{10, 5}, rng), dwd = up(dw0);
    kernels::embedding_backward(ctx(), idd, dyd, dwd);
    Tensor good_ids = ft::clone(ids), good_dy = ft::clone(dy);
    good_ids.data<int32_t>()[13] = 0;
    for (int64_t k = 0; k < 5; ++k) good_dy.f32()[13 * 5 + k] = 0.0f;
    EXPECT_TRUE(matches(down(dwd), backward_reference(good_ids, good_dy, dw0), 1e-5, 1e-5));
  }
}

TEST_P(EmbeddingOnBackend, RefusesBadArguments) {
  Tensor ids = up(Tensor::zeros(Shape{2, 3}, DType::I32)), w = up(Tensor::zeros(Shape{4, 5}));
  Tensor y = up(Tensor::zeros(Shape{2, 3, 5})), y_bad = up(Tensor::zeros(Shape{2, 3, 4}));
  Tensor f_ids = up(Tensor::zeros(Shape{2, 3})), w1 = up(Tensor::zeros(Shape{20}));
  EXPECT_THROW(kernels::embedding_forward(ctx(), ids, w, y_bad), Error);  // row size is not E
  EXPECT_THROW(kernels::embedding_forward(ctx(), f_ids, w, y), Error);    // float ids
  EXPECT_THROW(kernels::embedding_forward(ctx(), ids, w1, y), Error);     // a 1-D table
  Tensor ids5 = up(Tensor::zeros(Shape{1, 1, 1, 1, 2}, DType::I32));
  EXPECT_THROW(kernels::embedding_forward(ctx(), ids5, w, y), Error);  // no room for E
  Tensor dw_bad = up(Tensor::zeros(Shape{4, 4}));
  EXPECT_THROW(kernels::embedding_backward(ctx(), ids, y, dw_bad), Error);
  if (on_cuda()) {
    Tensor dw64 = up(Tensor::zeros(Shape{4, 5}, DType::F64));
    EXPECT_THROW(kernels::embedding_backward(ctx(), ids, y, dw64), Error);  // float64 grads: CPU only
  }
}

// float64 dweight (split-invariant math, CPU): each sample's sum per id is
// rounded to float and added exactly, so two parts of a batch give the whole
// batch's bits.
TEST(EmbeddingExact, GradientSumsPerSample) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(94);
  Tensor ids = random_ids(Shape{5, 11}, 6, rng, 2), dy = ft::random_tensor(Shape{5, 11, 7}, rng);
  auto grads = [&](int64_t lo, int64_t hi, Tensor& dw) {
    kernels::embedding_backward(ctx, ids.slice(lo, hi), dy.slice(lo, hi), dw);
  };
  Tensor whole = Tensor::zeros(Shape{6, 7}, DType::F64), split = Tensor::zeros(Shape{6, 7}, DType::F64);
  grads(0, 5, whole);
  grads(0, 2, split);
  grads(2, 5, split);
  EXPECT_TRUE(ft::same_bits(whole, split));
  const std::vector<double> want = backward_reference(ids, dy, Tensor::zeros(Shape{6, 7}));
  for (int64_t i = 0; i < whole.numel(); ++i)
    EXPECT_NEAR(whole.f64()[i], want[static_cast<size_t>(i)], 1e-5) << "element " << i;
}

}  // namespace
}  // namespace fanout
