// The CPU backend's threads and oneDNN plans: fanout's own kernels give the
// same bits on any thread count (threads take whole channels, planes or
// ranges); a training step repeats to the bit at a fixed thread count
// (oneDNN's order depends on the count, not on the run); long weight-gradient
// sums are cut into calls whose results add in double; plans are made once
// per shape.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/batchnorm.h"
#include "kernels/conv.h"
#include "kernels/dropout.h"
#include "kernels/cpu/plan_count.h"
#include "kernels/elementwise.h"
#include "kernels/loss.h"
#include "kernels/optim.h"
#include "kernels/pool.h"
#include "kernels/storage_test_util.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/parallel/single_device.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

namespace ft = fanout::testing;

// Runs `op` on a context with `threads` threads and returns its outputs.
using Op = std::function<std::vector<Tensor>(Context&)>;
std::vector<Tensor> run_with(int threads, const Op& op) {
  Context ctx(Device::cpu());
  ctx.math.cpu_threads = threads;
  return op(ctx);
}

void expect_same_bits_on_any_thread_count(const char* what, const Op& op) {
  const std::vector<Tensor> one = run_with(1, op);
  for (int t : {2, 3, 5}) {
    const std::vector<Tensor> many = run_with(t, op);
    ASSERT_EQ(many.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(ft::same_bits(many[i], one[i])) << what << ": output " << i << " with " << t << " threads";
      if (one[i].dtype() != DType::F64 && one[i].dtype() != DType::I32)  // every output written, not left as allocated
        EXPECT_GT(ft::l2_norm(ft::float32_values(one[i])), 0.0) << what << ": output " << i;
    }
  }
}

TEST(CpuThreads, OwnKernelsGiveTheSameBitsOnAnyThreadCount) {
  std::mt19937_64 rng(3);
  // (N, C, H, W) with planes of 1,000 elements: enough work for every thread count above.
  const Tensor x = ft::random_tensor(Shape{6, 20, 25, 40}, rng), dy = ft::random_tensor(x.shape(), rng);
  const Tensor gamma = ft::random_tensor(Shape{20}, rng), beta = ft::random_tensor(Shape{20}, rng);
  expect_same_bits_on_any_thread_count("batch norm", [&](Context& ctx) {
    Tensor stats = Tensor::empty(Shape{3, 20}, DType::F64), mean = Tensor::empty(Shape{2, 20});
    Tensor invstd = Tensor::empty(Shape{20}), y = Tensor::empty(x.shape()), gs = Tensor::empty(Shape{2, 20});
    Tensor dx = Tensor::empty(x.shape());
    kernels::bn_stats(ctx, x, stats);
    kernels::bn_finalize(ctx, stats, x.numel() / 20, 1e-5f, 0.1f, mean, invstd, nullptr, nullptr);
    kernels::bn_apply(ctx, x, mean, invstd, gamma, beta, y);
    kernels::bn_backward_reduce(ctx, x, dy, mean, invstd, gs);
    kernels::bn_backward_apply(ctx, x, dy, mean, invstd, gamma, gs, x.numel() / 20, dx);
    return std::vector<Tensor>{stats, y, gs, dx};
  });
  // The row kernels (channels-last storage), bfloat16 under autocast, and the fused forward.
  const Tensor xl = ft::stored_copy(x, DType::BF16, MemoryFormat::ChannelsLast);
  const Tensor dyl = ft::stored_copy(dy, DType::BF16, MemoryFormat::ChannelsLast);
  expect_same_bits_on_any_thread_count("batch norm, channels-last bfloat16", [&](Context& ctx) {
    ctx.math.autocast = DType::BF16;
    Tensor stats = Tensor::empty(Shape{3, 20}, DType::F64), mean = Tensor::empty(Shape{2, 20});
    Tensor invstd = Tensor::empty(Shape{20}), gs = Tensor::empty(Shape{2, 20});
    Tensor y = Tensor::empty(x.shape(), DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    Tensor yr = Tensor::empty(x.shape(), DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    Tensor dx = Tensor::empty(x.shape(), DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    kernels::bn_stats(ctx, xl, stats);
    kernels::bn_finalize(ctx, stats, x.numel() / 20, 1e-5f, 0.1f, mean, invstd, nullptr, nullptr);
    kernels::bn_apply(ctx, xl, mean, invstd, gamma, beta, y);
    kernels::bn_apply_add_relu(ctx, xl, mean, invstd, gamma, beta, &dyl, yr, DType::BF16);
    kernels::bn_backward_reduce(ctx, xl, dyl, mean, invstd, gs);
    kernels::bn_backward_apply(ctx, xl, dyl, mean, invstd, gamma, gs, x.numel() / 20, dx);
    return std::vector<Tensor>{stats, y, yr, gs, dx};
  });
  expect_same_bits_on_any_thread_count("2-D pooling", [&](Context& ctx) {
    const kernels::PoolGeometry g2{2, 2, 0}, g3{3, 2, 1};
    Tensor y2 = Tensor::empty(kernels::pool_output_shape(2, x.shape(), g2));
    Tensor a2 = Tensor::empty(y2.shape(), DType::I32), dx2 = Tensor::empty(x.shape());
    kernels::maxpool_forward(ctx, 2, x, g2, y2, a2);
    kernels::maxpool_backward(ctx, 2, y2, a2, dx2);
    Tensor y3 = Tensor::empty(kernels::pool_output_shape(2, x.shape(), g3)), dx3 = Tensor::empty(x.shape());
    kernels::avgpool_forward(ctx, 2, x, g3, y3);
    kernels::avgpool_backward(ctx, 2, y3, g3, dx3);
    Tensor gy = Tensor::empty(Shape{6, 20, 1, 1}), gdx = Tensor::empty(x.shape());
    kernels::global_avgpool_forward(ctx, x, gy);
    kernels::global_avgpool_backward(ctx, gy, gdx);
    return std::vector<Tensor>{y2, dx2, y3, dx3, gy, gdx};
  });
  expect_same_bits_on_any_thread_count("activations and sums", [&](Context& ctx) {
    Tensor r = Tensor::empty(x.shape()), dr = Tensor::empty(x.shape()), s = Tensor::empty(x.shape());
    Tensor g = Tensor::empty(x.shape()), dg = Tensor::empty(x.shape());
    kernels::relu_forward(ctx, x, r);
    kernels::relu_backward(ctx, r, dy, dr);
    kernels::activation_forward(ctx, {kernels::Act::Gelu}, x, g);
    kernels::activation_backward(ctx, {kernels::Act::Gelu}, x, dy, dg);
    kernels::add(ctx, x, dy, s);
    kernels::axpy(ctx, 0.5f, x, s);
    return std::vector<Tensor>{r, dr, g, dg, s};
  });
  expect_same_bits_on_any_thread_count("dropout, float32 and channels-last bfloat16", [&](Context& ctx) {
    Tensor d = Tensor::empty(x.shape());
    Tensor dl = Tensor::empty(x.shape(), DType::BF16, Device::cpu(), MemoryFormat::ChannelsLast);
    kernels::dropout(ctx, x, 0.3f, 77, 2, 1, d);
    kernels::dropout(ctx, xl, 0.3f, 77, 2, 3, dl);
    return std::vector<Tensor>{d, dl};
  });
  const Tensor v = ft::random_tensor(Shape{2, 6, 8, 10, 12}, rng);
  expect_same_bits_on_any_thread_count("3-D pooling and upsampling", [&](Context& ctx) {
    const kernels::PoolGeometry g{2, 2, 0};
    Tensor y = Tensor::empty(kernels::pool_output_shape(3, v.shape(), g)), a = Tensor::empty(y.shape(), DType::I32);
    Tensor dx = Tensor::empty(v.shape()), avg = Tensor::empty(y.shape()), davg = Tensor::empty(v.shape());
    kernels::maxpool_forward(ctx, 3, v, g, y, a);
    kernels::maxpool_backward(ctx, 3, y, a, dx);
    kernels::avgpool_forward(ctx, 3, v, g, avg);
    kernels::avgpool_backward(ctx, 3, avg, g, davg);
    Tensor up = Tensor::empty(kernels::upsample3d_output_shape(v.shape(), 2)), dup = Tensor::empty(v.shape());
    kernels::upsample3d_nearest_forward(ctx, v, 2, up);
    kernels::upsample3d_nearest_backward(ctx, up, 2, dup);
    return std::vector<Tensor>{y, dx, avg, davg, up, dup};
  });
  // Causal attention (forward splits heads into row blocks, backward takes whole heads): few and many
  // heads, partial blocks (T = 100, 70) and an odd D.
  for (const Shape& s : {Shape{1, 3, 100, 24}, Shape{4, 8, 70, 17}}) {
    const Tensor q = ft::random_tensor(s, rng), k = ft::random_tensor(s, rng), w = ft::random_tensor(s, rng);
    const Tensor g = ft::random_tensor(s, rng);
    expect_same_bits_on_any_thread_count("attention", [&](Context& ctx) {
      Tensor y = Tensor::empty(s), lse = Tensor::empty(Shape{s[0], s[1], s[2]});
      Tensor dq = Tensor::empty(s), dk = Tensor::empty(s), dv = Tensor::empty(s);
      kernels::attention_forward(ctx, q, k, w, 0.3f, y, lse);
      kernels::attention_backward(ctx, q, k, w, 0.3f, y, lse, g, dq, dk, dv);
      return std::vector<Tensor>{y, lse, dq, dk, dv};
    });
  }
  // Softmax cross-entropy: rows split between threads, the losses added in row order.
  const Tensor logits = ft::random_tensor(Shape{300, 700}, rng, -5.0f, 5.0f), labels = ft::random_labels(300, 700, rng);
  expect_same_bits_on_any_thread_count("cross-entropy", [&](Context& ctx) {
    Tensor loss = Tensor::empty(Shape{1}), rows = Tensor::empty(Shape{300}), correct = Tensor::empty(Shape{1}, DType::I32);
    Tensor d = Tensor::empty(logits.shape());
    kernels::softmax_xent(ctx, logits, labels, 0.1f, loss, kernels::XentOutputs{&rows, &correct, &d, 1.0f / 300});
    return std::vector<Tensor>{loss, rows, correct, d};
  });
  // The same on bfloat16 logits (a row buffer per block of rows).
  const Tensor logits_bf16 = ft::stored_copy(logits, DType::BF16, MemoryFormat::Contiguous);
  expect_same_bits_on_any_thread_count("cross-entropy, bfloat16", [&](Context& ctx) {
    Tensor loss = Tensor::empty(Shape{1}), rows = Tensor::empty(Shape{300}), correct = Tensor::empty(Shape{1}, DType::I32);
    Tensor d = Tensor::empty(logits.shape(), DType::BF16);
    kernels::softmax_xent(ctx, logits_bf16, labels, 0.1f, loss,
                          kernels::XentOutputs{&rows, &correct, &d, 1.0f / 300, DType::BF16});
    return std::vector<Tensor>{loss, rows, correct, d};
  });
  // The optimizer's kernels over 5 M elements (sum_squares: 64 blocks), AdamW on every chunk of the table.
  const int64_t n = 5'000'037;
  const Tensor p0 = ft::random_tensor(Shape{n}, rng), g0 = ft::random_tensor(Shape{n}, rng, -2.0f, 2.0f);
  expect_same_bits_on_any_thread_count("optimizer kernels", [&](Context& ctx) {
    Tensor p = ft::clone(p0), g = ft::clone(g0), m = ft::clone(g0), v = Tensor::zeros(Shape{n});
    const int64_t count = (n + kernels::kUpdateChunk - 1) / kernels::kUpdateChunk;
    Tensor chunks = Tensor::empty(Shape{count, 2}, DType::I64);
    for (int64_t k = 0; k < count; ++k) {
      chunks.data<int64_t>()[2 * k] = k * kernels::kUpdateChunk;
      chunks.data<int64_t>()[2 * k + 1] = std::min(kernels::kUpdateChunk, n - k * kernels::kUpdateChunk);
    }
    kernels::AdamStep h;
    h.decay = 0.999f;
    h.step_size = 1e-3f;
    kernels::adam_step(ctx, p, g, m, v, v, chunks, h);
    Tensor sum = Tensor::empty(Shape{1}, DType::F64);
    sum.f64()[0] = kernels::sum_squares(ctx, g);
    kernels::clamp_abs(ctx, g, 1.0f);
    return std::vector<Tensor>{p, m, v, sum, g};
  });
}

// A kernel's exception inside a threaded range reaches the caller.
TEST(CpuThreads, AnErrorInsideAThreadedKernelIsThrownToTheCaller) {
  Context ctx(Device::cpu());
  ctx.math.cpu_threads = 4;
  std::mt19937_64 rng(4);
  const Tensor dy = ft::random_tensor(Shape{4, 8, 16, 16}, rng);
  Tensor argmax = Tensor::empty(dy.shape(), DType::I32), dx = Tensor::empty(Shape{4, 8, 32, 32});
  for (int64_t i = 0; i < argmax.numel(); ++i) argmax.data<int32_t>()[i] = 0;
  argmax.data<int32_t>()[argmax.numel() - 1] = 5000;  // outside a 32x32 plane, in the last thread's range
  try {
    kernels::maxpool_backward(ctx, 2, dy, argmax, dx);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argmax 5000 outside a volume"), std::string::npos) << e.what();
  }
}

// Same thread count, same inputs: the same bits, run after run (what
// --deterministic asks for; on CPU devices it always holds).
TEST(CpuThreads, TrainingStepsRepeatToTheBitAtOneThreadCount) {
  const Shape sample{3, 16, 16};
  auto batches = ft::random_batches(sample, 24, 3, 9);
  auto train = [&] {
    auto m = models::make_model("cnn", sample, 10, 2);
    MathOptions math;
    math.cpu_threads = 2;
    ft::Trained<SingleDeviceEngine> eng(*m, Device::cpu(), *make_criterion({}), 2, math);
    for (auto& b : batches) eng.train_step(b.x, b.y, 0.05f);
    return m->arenas().params.to(Device::cpu());
  };
  const Tensor a = train(), b = train();
  EXPECT_TRUE(ft::same_bits(a, b));
  EXPECT_FALSE(ft::same_bits(a, models::make_model("cnn", sample, 10, 2)->arenas().params)) << "nothing trained";
}

// dW of a first layer: 64 images of 28x28 outputs give 50,176 terms per
// element. One oneDNN call adds them float after float; the kernel cuts the
// batch into calls of at most 4,096 terms (here 12 calls of 5 images and one
// of 4) and sums their float results in double. Shown bit for bit against
// those calls made one by one, on any ISA; and against float64 (measured on
// 2 AVX-512 cores, 2026-11-26: 1.2e-4 / 4.0e-5 relative with 1 / 2 threads,
// against 3.2e-4 / 1.9e-4 in one call).
TEST(CpuConv, LongWeightGradientSumsAreCutAndSummedInDouble) {
  std::mt19937_64 rng(12);
  const Tensor x = ft::random_tensor(Shape{64, 3, 32, 32}, rng), w = ft::random_tensor(Shape{6, 3, 5, 5}, rng);
  const kernels::Conv2dGeometry g{1, 0};
  const Tensor dy = ft::random_tensor(kernels::conv2d_output_shape(x.shape(), w.shape(), g), rng);
  const Tensor dw0 = ft::random_tensor(w.shape(), rng);
  for (int threads : {1, 2}) {
    Context ctx(Device::cpu());
    ctx.math.cpu_threads = threads;
    Tensor dw = ft::clone(dw0), db = Tensor::zeros(Shape{6});
    kernels::conv2d_backward(ctx, x, w, dy, g, nullptr, dw, &db);

    std::vector<double> sum(w.numel(), 0.0);
    for (int64_t first = 0; first < 64; first += 5) {
      const int64_t last = std::min<int64_t>(first + 5, 64);
      Tensor part = Tensor::zeros(w.shape());
      kernels::conv2d_backward(ctx, x.slice(first, last), w, dy.slice(first, last), g, nullptr, part, nullptr);
      for (int64_t i = 0; i < w.numel(); ++i) sum[i] += part.f32()[i];
    }
    Tensor want = Tensor::empty(w.shape());
    for (int64_t i = 0; i < w.numel(); ++i) want.f32()[i] = static_cast<float>(dw0.f32()[i] + sum[i]);
    EXPECT_TRUE(ft::same_bits(dw, want)) << threads << " threads";

    std::vector<double> ref(w.numel(), 0.0);
    const float *xp = x.f32(), *gp = dy.f32();
    for (int64_t n = 0; n < 64; ++n)
      for (int64_t o = 0; o < 6; ++o)
        for (int64_t i = 0; i < 28; ++i)
          for (int64_t j = 0; j < 28; ++j) {
            const double gv = gp[((n * 6 + o) * 28 + i) * 28 + j];
            for (int64_t c = 0; c < 3; ++c)
              for (int64_t a = 0; a < 5; ++a)
                for (int64_t e = 0; e < 5; ++e)
                  ref[((o * 3 + c) * 5 + a) * 5 + e] += gv * xp[((n * 3 + c) * 32 + i + a) * 32 + j + e];
          }
    double worst = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double got = double(dw.f32()[i]) - dw0.f32()[i];
      worst = std::max(worst, std::abs(got - ref[i]) / (1 + std::abs(ref[i])));
    }
    std::printf("threads %d: dW relative error %.2e against float64\n", threads, worst);
    EXPECT_LT(worst, 1e-3) << threads << " threads";
  }
}

// Plans are per shape: a second call of the same shape makes none, a new
// batch size makes its own.
TEST(CpuConv, PlansAreMadeOncePerShape) {
  Context ctx(Device::cpu());
  std::mt19937_64 rng(13);
  const Tensor w = ft::random_tensor(Shape{4, 3, 3, 3}, rng);
  const kernels::Conv2dGeometry g{1, 1};
  auto forward = [&](int64_t n) {
    const Tensor x = ft::random_tensor(Shape{n, 3, 9, 9}, rng);
    Tensor y = Tensor::empty(kernels::conv2d_output_shape(x.shape(), w.shape(), g));
    kernels::conv2d_forward(ctx, x, w, nullptr, g, y);
  };
  forward(5);
  const uint64_t after_first = kernels::cpu::onednn_plans_made();
  forward(5);
  EXPECT_EQ(kernels::cpu::onednn_plans_made(), after_first);
  forward(7);
  EXPECT_EQ(kernels::cpu::onednn_plans_made(), after_first + 1);
}

}  // namespace
}  // namespace fanout
