// torch_tool: the C++ side of the PyTorch conformance test
// (torch_conformance.py). One zoo model, one batch, on one CPU device:
//   torch_tool MODEL SHAPE BATCH SEED OUT
// builds MODEL for samples of SHAPE (CxHxW, or CxDxHxW) with fanout's
// initialization from SEED, draws a batch (inputs N(0, 1); class labels, or
// dense targets in [0, 1) for a dense model under the mean squared error)
// and writes OUT (safetensors):
//   init.<name>    every parameter and buffer before training
//   x, y           the batch (y: int32 labels or float32 targets)
//   logits         the training-mode forward of x (running statistics move once)
//   grad.<name>    each parameter's gradient of the mean loss on (x, y), from a
//                  second forward
//   step2.<name>   parameters and buffers after that gradient's SGD step and
//                  one more forward, backward and step on (x, y) (lr 0.05,
//                  momentum 0.9, weight decay 5e-4)
// Exit codes: 0 ok, 1 fanout::Error (message on stderr), 2 usage.
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/trainer.h"
#include "support/shape_arg.h"

using namespace fanout;

namespace {

int run(const std::string& name, const std::string& shape_arg, int64_t batch, uint64_t seed,
        const std::string& out) {
  const Shape sample = testing::parse_shape(shape_arg);
  const bool dense = models::dense_output(name);
  auto m = models::make_model(name, sample, dense ? 4 : 10, seed);
  std::map<std::string, Tensor> file;
  for (auto& [n, t] : m->state_dict()) file["init." + n] = t.to(Device::cpu());

  Shape xs;
  xs.ndim = sample.ndim + 1;
  xs.d[0] = batch;
  for (int i = 0; i < sample.ndim; ++i) xs.d[i + 1] = sample.d[i];
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor x = Tensor::empty(xs);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = normal(rng);

  Context ctx(Device::cpu());
  const Tensor logits = m->forward(x, ctx).to(Device::cpu());
  Tensor y;
  LossOptions loss;
  if (dense) {
    loss.criterion = CriterionKind::Mse;
    y = Tensor::empty(logits.shape());
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < y.numel(); ++i) y.f32()[i] = u(rng);
  } else {
    y = Tensor::empty(Shape{batch}, DType::I32);
    for (int64_t i = 0; i < batch; ++i) y.data<int32_t>()[i] = static_cast<int32_t>(rng() % logits.size(1));
  }
  file["x"] = x;
  file["y"] = y;
  file["logits"] = logits;

  SingleDeviceEngine engine(*m, Device::cpu(), *make_criterion(loss), seed);
  optim::OptimizerOptions o;
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.weight_decay = 5e-4f;
  auto opt = optim::make_optimizer(*m, engine.primary_context(), o);
  engine.forward_backward(x, y, 1.0f / static_cast<float>(batch), true);
  for (auto& [n, p] : m->named_parameters()) file["grad." + n] = p->grad.to(Device::cpu());
  opt->step();
  opt->zero_grad();
  train::train_step(engine, *opt, x, y, o.lr);
  for (auto& [n, t] : m->state_dict()) file["step2." + n] = t.to(Device::cpu());

  std::vector<std::pair<std::string, Tensor>> tensors(file.begin(), file.end());
  io::save_safetensors(out, tensors, {{"model", name}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: torch_tool MODEL SHAPE BATCH SEED OUT\n");
    return 2;
  }
  try {
    return run(argv[1], argv[2], std::stoll(argv[3]), std::stoull(argv[4]), argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_tool: %s\n", e.what());
    return 1;
  }
}
