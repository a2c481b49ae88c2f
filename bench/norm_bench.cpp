// norm-bench: the layers between cnn's convolutions (BatchNorm, ReLU, 2x2 max
// pooling; forward and backward) on one thread, at the shapes one replica of
// `dp-train --model cnn --devices cpu:2` sees (batch 16): fanout's CPU loops,
// which work on NCHW, split (BatchNorm, then ReLU) and fused (BatchNorm and
// ReLU as one pass each way, as Sequential runs them), against oneDNN's primitives (BatchNorm with ReLU fused,
// pooling with its workspace) on NCHW and on its blocked layout (16 channels
// per block with AVX-512, 8 below it).
// Best of 5 runs of 30 calls each. bench/RESULTS.md has the numbers.
#include <omp.h>

#include <algorithm>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "kernels/batchnorm.h"
#include "kernels/pool.h"
#include "kernels/activation.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
using namespace fanout;
using clk = std::chrono::steady_clock;
template <class F> double best_ms(F f, int reps = 30) {
  for (int i = 0; i < 5; ++i) f();
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    auto t0 = clk::now();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, std::chrono::duration<double, std::milli>(clk::now() - t0).count() / reps);
  }
  return best;
}
Tensor rnd(const Shape& s, std::mt19937& g) {
  Tensor t = Tensor::empty(s);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = u(g);
  return t;
}
int main(int argc, char** argv) {
  if (argc > 1) {  // no options: one thread, fixed shapes
    const bool help = !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h");
    std::fprintf(help ? stdout : stderr, "usage: norm-bench (no arguments: one thread, fixed shapes)\n");
    return help ? 0 : 2;
  }
  omp_set_num_threads(1);
  std::mt19937 g(1);
  Context ctx(Device::cpu());
  ctx.math.cpu_threads = 1;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const int64_t shapes[3][4] = {{16, 32, 28, 28}, {16, 64, 14, 14}, {16, 128, 7, 7}};
  const int isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  const bool avx512 = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  std::printf("shape            fanout ms   fused ms   oneDNN nchw ms   oneDNN %s ms\n", avx512 ? "nChw16c" : " nChw8c");
  double tot_f = 0, tot_u = 0, tot_p = 0, tot_b = 0;
  for (auto& sh : shapes) {
    Shape s{sh[0], sh[1], sh[2], sh[3]};
    const int64_t C = sh[1], cnt = sh[0] * sh[2] * sh[3];
    Tensor x = rnd(s, g), y = Tensor::empty(s), dx = Tensor::empty(s), dx2 = Tensor::empty(s);
    Tensor gamma = rnd(Shape{C}, g), beta = rnd(Shape{C}, g);
    Tensor stats = Tensor::empty(Shape{3, C}, DType::F64), mean = Tensor::empty(Shape{2, C}), invstd = Tensor::empty(Shape{C});
    Tensor gs = Tensor::empty(Shape{2, C});
    Shape ps{sh[0], sh[1], sh[2] / 2, sh[3] / 2};
    Tensor py = Tensor::empty(ps), pa = Tensor::empty(ps, DType::I32), pdy = rnd(ps, g);
    kernels::PoolGeometry geo;
    // fanout: BN fwd (stats, finalize, apply) + ReLU fwd + pool fwd; backward: pool, relu, BN reduce+apply.
    double f = best_ms([&] {
      kernels::bn_stats(ctx, x, stats);
      kernels::bn_finalize(ctx, stats, cnt, 1e-5f, 0.1f, mean, invstd, nullptr, nullptr);
      kernels::bn_apply(ctx, x, mean, invstd, gamma, beta, y);
      kernels::relu_forward(ctx, y, y);
      kernels::maxpool_forward(ctx, 2, y, geo, py, pa);
      kernels::maxpool_backward(ctx, 2, pdy, pa, dx);
      kernels::relu_backward(ctx, y, dx, dx);
      kernels::bn_backward_reduce(ctx, x, dx, mean, invstd, gs);
      kernels::bn_backward_apply(ctx, x, dx, mean, invstd, gamma, gs, cnt, dx);
    });
    // fanout fused: the same with BatchNorm and ReLU as one pass each way (what
    // Sequential runs for a BatchNorm followed by an in-place ReLU).
    Tensor rm = Tensor::zeros(Shape{C}), rv = Tensor::zeros(Shape{C});
    double fu = best_ms([&] {
      kernels::bn_train_add_relu(ctx, x, nullptr, gamma, beta, 1e-5f, 0.1f, stats, mean, invstd, rm, rv, y, nullptr);
      kernels::maxpool_forward(ctx, 2, y, geo, py, pa);
      kernels::maxpool_backward(ctx, 2, pdy, pa, dx);
      kernels::bn_backward_relu(ctx, x, y, dx, mean, invstd, gamma, nullptr, gs, dx, dx2);
    });
    // BatchNorm and ReLU alone, each way, split and fused.
    double ff = best_ms([&] { kernels::bn_train_add_relu(ctx, x, nullptr, gamma, beta, 1e-5f, 0.1f, stats, mean, invstd, rm, rv, y, nullptr); });
    double fs = best_ms([&] { kernels::bn_stats(ctx, x, stats);
      kernels::bn_finalize(ctx, stats, cnt, 1e-5f, 0.1f, mean, invstd, nullptr, nullptr);
      kernels::bn_apply(ctx, x, mean, invstd, gamma, beta, y);
      kernels::relu_forward(ctx, y, y); });
    Tensor dyy = rnd(s, g);
    double bf = best_ms([&] { dx.copy_from(dyy); kernels::bn_backward_relu(ctx, x, y, dx, mean, invstd, gamma, nullptr, gs, dx, dx2); });
    double bs = best_ms([&] { dx.copy_from(dyy); kernels::relu_backward(ctx, y, dx, dx);
      kernels::bn_backward_reduce(ctx, x, dx, mean, invstd, gs);
      kernels::bn_backward_apply(ctx, x, dx, mean, invstd, gamma, gs, cnt, dx2); });
    std::printf("  BatchNorm+ReLU alone: forward split %.3f fused %.3f ms, backward split %.3f fused %.3f ms\n", fs, ff,
                bs, bf);
    double res[2];
    for (int blocked = 0; blocked < 2; ++blocked) {
      dnnl::memory::dims d = {sh[0], sh[1], sh[2], sh[3]}, pd = {sh[0], sh[1], sh[2] / 2, sh[3] / 2};
      auto fmt = blocked ? (avx512 ? tag::nChw16c : tag::nChw8c) : tag::nchw;
      dnnl::memory::desc md(d, dt::f32, fmt), pmd(pd, dt::f32, fmt);
#if DNNL_VERSION_MAJOR >= 3
      auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift |
                   dnnl::normalization_flags::fuse_norm_relu;
      dnnl::batch_normalization_forward::primitive_desc bnf(eng, dnnl::prop_kind::forward_training, md, md, 1e-5f, flags);
      dnnl::batch_normalization_backward::primitive_desc bnb(eng, dnnl::prop_kind::backward, md, md, md, 1e-5f, flags, bnf);
      dnnl::pooling_forward::primitive_desc plf(eng, dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, md, pmd,
                                                {2, 2}, {2, 2}, {0, 0}, {0, 0}, {0, 0});
      dnnl::pooling_backward::primitive_desc plb(eng, dnnl::algorithm::pooling_max, md, pmd, {2, 2}, {2, 2}, {0, 0}, {0, 0},
                                                 {0, 0}, plf);
      const dnnl::memory::desc cd({2 * C}, dt::f32, tag::a);  // scale then shift, one buffer
#else
      auto flags = dnnl::normalization_flags::use_scale_shift | dnnl::normalization_flags::fuse_norm_relu;
      dnnl::batch_normalization_forward::primitive_desc bnf({dnnl::prop_kind::forward_training, md, 1e-5f, flags}, eng);
      dnnl::batch_normalization_backward::primitive_desc bnb({dnnl::prop_kind::backward, md, md, 1e-5f, flags}, eng, bnf);
      dnnl::pooling_forward::primitive_desc plf({dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, md, pmd, {2, 2}, {2, 2}, {0, 0}, {0, 0}}, eng);
      dnnl::pooling_backward::primitive_desc plb({dnnl::algorithm::pooling_max, md, pmd, {2, 2}, {2, 2}, {0, 0}, {0, 0}}, eng, plf);
      const dnnl::memory::desc cd = bnf.weights_desc();
#endif
      dnnl::memory X(md, eng), Y(md, eng), DY(md, eng), DX(md, eng), PY(pmd, eng), PDY(pmd, eng), DX2(md, eng);
      dnnl::memory SS(cd, eng), DSS(cd, eng), M(bnf.mean_desc(), eng), V(bnf.variance_desc(), eng);
      dnnl::memory WS(bnf.workspace_desc(), eng), PWS(plf.workspace_desc(), eng);
#if DNNL_VERSION_MAJOR >= 3
      // oneDNN 3 takes scale and shift as two arguments: halves of SS and DSS.
      const dnnl::memory::desc c1({C}, dt::f32, tag::a);
      float* ss = static_cast<float*>(SS.get_data_handle());
      float* dss = static_cast<float*>(DSS.get_data_handle());
      dnnl::memory S(c1, eng, ss), H(c1, eng, ss + C), DS(c1, eng, dss), DH(c1, eng, dss + C);
#endif
      // Random values either way: the layout does not change the work timed.
      std::copy(x.f32(), x.f32() + x.numel(), (float*)X.get_data_handle());
      std::copy(pdy.f32(), pdy.f32() + pdy.numel(), (float*)PDY.get_data_handle());
      for (int i = 0; i < 2 * C; ++i) ((float*)SS.get_data_handle())[i] = 1.0f;
      dnnl::batch_normalization_forward bf(bnf);
      dnnl::batch_normalization_backward bb(bnb);
      dnnl::pooling_forward pf(plf);
      dnnl::pooling_backward pb(plb);
      res[blocked] = best_ms([&] {
#if DNNL_VERSION_MAJOR >= 3
        bf.execute(st, {{DNNL_ARG_SRC, X}, {DNNL_ARG_DST, Y}, {DNNL_ARG_SCALE, S}, {DNNL_ARG_SHIFT, H}, {DNNL_ARG_MEAN, M}, {DNNL_ARG_VARIANCE, V}, {DNNL_ARG_WORKSPACE, WS}});
#else
        bf.execute(st, {{DNNL_ARG_SRC, X}, {DNNL_ARG_DST, Y}, {DNNL_ARG_SCALE_SHIFT, SS}, {DNNL_ARG_MEAN, M}, {DNNL_ARG_VARIANCE, V}, {DNNL_ARG_WORKSPACE, WS}});
#endif
        pf.execute(st, {{DNNL_ARG_SRC, Y}, {DNNL_ARG_DST, PY}, {DNNL_ARG_WORKSPACE, PWS}});
        pb.execute(st, {{DNNL_ARG_DIFF_DST, PDY}, {DNNL_ARG_DIFF_SRC, DY}, {DNNL_ARG_WORKSPACE, PWS}});
#if DNNL_VERSION_MAJOR >= 3
        bb.execute(st, {{DNNL_ARG_SRC, X}, {DNNL_ARG_DIFF_DST, DY}, {DNNL_ARG_SCALE, S}, {DNNL_ARG_MEAN, M}, {DNNL_ARG_VARIANCE, V}, {DNNL_ARG_WORKSPACE, WS}, {DNNL_ARG_DIFF_SRC, DX2}, {DNNL_ARG_DIFF_SCALE, DS}, {DNNL_ARG_DIFF_SHIFT, DH}});
#else
        bb.execute(st, {{DNNL_ARG_SRC, X}, {DNNL_ARG_DIFF_DST, DY}, {DNNL_ARG_SCALE_SHIFT, SS}, {DNNL_ARG_MEAN, M}, {DNNL_ARG_VARIANCE, V}, {DNNL_ARG_WORKSPACE, WS}, {DNNL_ARG_DIFF_SRC, DX2}, {DNNL_ARG_DIFF_SCALE_SHIFT, DSS}});
#endif
        st.wait();
      });
    }
    std::printf("%ldx%ldx%ldx%ld  %9.3f   %9.3f   %14.3f   %17.3f\n", (long)sh[0], (long)sh[1], (long)sh[2],
                (long)sh[3], f, fu, res[0], res[1]);
    tot_f += f; tot_u += fu; tot_p += res[0]; tot_b += res[1];
  }
  std::printf("sum            %9.3f   %9.3f   %14.3f   %17.3f\n", tot_f, tot_u, tot_p, tot_b);
}
