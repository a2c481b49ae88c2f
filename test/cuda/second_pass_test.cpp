// The second training pass on cuda:0 against the CPU's, over variants of a
// conv-BatchNorm-ReLU-pool stack and the zoo's cnn: after one SGD step on
// each side, the next pass's gradients agree by norm. On an H100 the zoo's
// cnn missed by 1.4% in conv1..conv2 at its second pass while three blocks
// of the same layers without its fc1-relu-fc2 head agreed to 1.2e-6; the
// variants (no pooling, ReLU not in place, no BatchNorm, lr 0,
// deterministic and benchmarked cuDNN, a fresh GPU engine against the
// continued one) say which part is to blame.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "cuda/cuda_test_util.h"
#include "models/layers/activation.h"
#include "models/layers/batchnorm.h"
#include "models/layers/conv.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pooling.h"
#include "models/layers/sequential.h"
#include "models/zoo/zoo.h"
#include "runtime/parallel/single_device.h"
#include "support/trained.h"

namespace fanout {
namespace {
using namespace models;
struct V {
  const char* name;
  bool bn = true, inplace = true, pool = true, det = false, fresh_gpu = false;
  float lr = 0.02f;
  int blocks = 2;
  bool bench = false;
  const char* zoo = nullptr;  // a zoo model instead of the stack
  int head = 0;               // 1: fc1-ReLU(in place)-fc2 head as the cnn's; 2: its ReLU not in place
};
std::unique_ptr<Module> net(const V& v) {
  if (v.zoo) return make_model(v.zoo, Shape{1, 28, 28}, 10, 13);
  auto m = std::make_unique<Sequential>();
  int64_t c = 1, h = 28;
  const int64_t widths[3] = {32, 64, 128};
  for (int i = 0; i < v.blocks; ++i) {
    const std::string k = std::to_string(i + 1);
    m->add("conv" + k, std::make_unique<Conv2d>(c, widths[i], 3, 1, 1, false));
    if (v.bn) m->add("bn" + k, std::make_unique<BatchNorm2d>(widths[i]));
    m->add("relu" + k, std::make_unique<ReLU>(v.inplace));
    if (v.pool) {
      m->add("pool" + k, std::make_unique<MaxPool2d>(2, 2));
      h /= 2;
    }
    c = widths[i];
  }
  m->add("flatten", std::make_unique<Flatten>());
  if (v.head) {
    m->add("fc1", std::make_unique<Linear>(c * h * h, 256));
    m->add("relu4", std::make_unique<ReLU>(v.head == 1));
    m->add("fc2", std::make_unique<Linear>(256, 10));
  } else {
    m->add("fc", std::make_unique<Linear>(c * h * h, 10));
  }
  m->init(13);
  return m;
}
double worst(Module& a, const Tensor& ga, const Tensor& gb, const char* tag) {
  double w = 0;
  for (auto& [name, p] : a.named_parameters()) {
    const double r = cudatest::slice_rel(gb, ga, p->offset, p->shape.numel());
    if (r > 1e-5) std::printf("  %-10s %-14s %.3g\n", tag, name.c_str(), r);
    w = std::max(w, r);
  }
  return w;
}
TEST(CudaSecondPass, MatchesCpu) {
  FANOUT_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(14);
  const Tensor x = testing::random_tensor(Shape{6, 1, 28, 28}, rng), y = testing::random_labels(6, 10, rng);
  // The zoo cnn first and again later: a fault that shows only in a fresh
  // process (plans built, workspace grown during its first step) parts them.
  V vs[] = {{"K0 zoo cnn, first in the process", true, true, true, false, false, 0.02f, 3, false, "cnn"},
            {"A bn inplace pool"},
            {"B no pool", true, true, false},
            {"C not inplace", true, false, true},
            {"D no bn", false, true, true},
            {"E lr 0", true, true, true, false, false, 0.0f},
            {"F deterministic", true, true, true, true},
            {"G gpu fresh vs continued", true, true, true, false, true},
            {"H three blocks", true, true, true, false, false, 0.02f, 3},
            {"I one block", true, true, true, false, false, 0.02f, 1},
            {"J cudnn benchmark", true, true, true, false, false, 0.02f, 2, true},
            {"K zoo cnn", true, true, true, false, false, 0.02f, 3, false, "cnn"},
            {"L zoo cnn, lr 0", true, true, true, false, false, 0.0f, 3, false, "cnn"},
            {"M zoo cnn, deterministic", true, true, true, true, false, 0.02f, 3, false, "cnn"},
            {"N zoo cnn, gpu fresh vs continued", true, true, true, false, true, 0.02f, 3, false, "cnn"},
            {"O zoo lenet", true, true, true, false, false, 0.02f, 3, false, "lenet"},
            {"P three blocks, cnn's head", true, true, true, false, false, 0.02f, 3, false, nullptr, 1},
            {"Q three blocks, head's ReLU apart", true, true, true, false, false, 0.02f, 3, false, nullptr, 2}};
  for (const V& v : vs) {
    auto mc = net(v), mg = net(v);
    MathOptions math;
    math.deterministic = v.det;
    math.cudnn_benchmark = v.bench;
    testing::Trained<SingleDeviceEngine> ec(*mc, Device::cpu(), *make_criterion({}), 13, math);
    testing::Trained<SingleDeviceEngine> eg(*mg, cudatest::gpu(), *make_criterion({}), 13, math);
    ec.train_step(x, y, v.lr);
    eg.train_step(x, y, v.lr);
    eg.primary_context().compute().synchronize();
    double w;
    if (v.fresh_gpu) {
      auto m3 = net(v);
      m3->arenas().params.copy_from(mg->arenas().params.to(Device::cpu()));
      m3->arenas().buffers.copy_from(mg->arenas().buffers.to(Device::cpu()));
      testing::Trained<SingleDeviceEngine> e3(*m3, cudatest::gpu(), *make_criterion({}), 13, math);
      eg.forward_backward_batch(x, y);
      e3.forward_backward_batch(x, y);
      eg.primary_context().compute().synchronize();
      e3.primary_context().compute().synchronize();
      w = worst(*mg, mg->arenas().grads.to(Device::cpu()), m3->arenas().grads.to(Device::cpu()), "gpu/gpu");
    } else {
      ec.forward_backward_batch(x, y);
      eg.forward_backward_batch(x, y);
      eg.primary_context().compute().synchronize();
      w = worst(*mc, mc->arenas().grads, mg->arenas().grads.to(Device::cpu()), "cpu/gpu");
    }
    std::printf("%-28s worst %.3g\n", v.name, w);
    EXPECT_LE(w, 1e-4) << v.name;
  }
}
}  // namespace
}  // namespace fanout
