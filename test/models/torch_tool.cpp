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
// A GPT ("gpt:KEY=VALUE,...", models/zoo/gpt.h) instead:
//   torch_tool gpt:... T BATCH SEED OUT [DEVICES]
// builds it (vocab_size from the spec, or 65 where the spec leaves it to the data), draws
// (BATCH, T) int32 token ids x and targets y in [0, vocab_size) (every
// target valid) and writes
//   init.<name>    every parameter before training
//   x, y           the batch
//   logits         the training-mode forward of x, (BATCH, T, vocab_size)
//   loss           (float64, 1 element) the token cross-entropy's mean
//   grad.<name>    each parameter's gradient of that mean
//   norm, losses   (float64, 5 elements) each step's gradient norm before
//                  clipping and its mean loss
//   stepK.<name>   the parameters after K = 1..5 steps on (x, y): AdamW (lr
//                  1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the
//                  parameters of two or more dimensions, none on the
//                  others) after clip_grad_norm 1.0
//   gradK.<name>   the gradient (before clipping) step K + 1 = 2..5 took,
//                  at stepK's parameters
// on DEVICES (default "cpu"; "cpu:3": DataParallel over three CPU devices).
// Exit codes: 0 ok, 1 fanout::Error (message on stderr), 2 usage.
#include <cstdio>
#include <map>
#include <random>
#include <string>

#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine_factory.h"
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

int run_gpt(const std::string& name, int64_t t, int64_t batch, uint64_t seed, const std::string& out,
            const std::string& devices) {
  // The data's vocabulary: the configuration's (65, shakespeare_char's, where the spec leaves it to the data).
  const int64_t vocab = models::parse_gpt_config(models::gpt_spec(name), 65).vocab_size;
  auto m = models::make_model(name, Shape{t}, static_cast<int>(vocab), seed);
  std::map<std::string, Tensor> file;
  for (auto& [n, v] : m->state_dict()) file["init." + n] = v.to(Device::cpu());

  std::mt19937_64 rng(seed + 1);
  Tensor x = Tensor::empty(Shape{batch, t}, DType::I32);
  Tensor y = Tensor::empty(Shape{batch, t}, DType::I32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  file["x"] = x;
  file["y"] = y;
  {
    Context ctx(Device::cpu());
    file["logits"] = m->forward(x, ctx).to(Device::cpu());
  }

  EngineSpec spec;
  spec.devices = parse_devices(devices);
  spec.force_data_parallel = devices != "cpu";
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  auto engine = make_engine(*m, std::move(spec));
  optim::OptimizerOptions o;
  o.kind = optim::OptimizerKind::AdamW;
  o.lr = 1e-3f;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.no_decay_norm_bias = true;
  auto opt = optim::make_optimizer(engine->model(), engine->primary_context(), o);
  constexpr int kSteps = 5;
  Tensor norms = Tensor::empty(Shape{kSteps}, DType::F64), losses = Tensor::empty(Shape{kSteps}, DType::F64);
  for (int s = 0; s < kSteps; ++s) {
    const StepResult r = engine->forward_backward(x, y, 1.0f / static_cast<float>(batch), true);
    losses.data<double>()[s] = r.loss_sum / static_cast<double>(batch);
    if (s == 0) {
      Tensor loss = Tensor::empty(Shape{1}, DType::F64);
      loss.data<double>()[0] = losses.data<double>()[0];
      file["loss"] = loss;
    }
    const std::string g = s == 0 ? "grad." : "grad" + std::to_string(s) + ".";
    for (auto& [n, p] : engine->model().named_parameters()) file[g + n] = p->grad.to(Device::cpu());
    norms.data<double>()[s] = optim::clip_grad_norm(*opt, 1.0);
    opt->step();
    opt->zero_grad();
    for (auto& [n, v] : m->state_dict()) file["step" + std::to_string(s + 1) + "." + n] = v.to(Device::cpu());
  }
  file["norm"] = norms;
  file["losses"] = losses;

  std::vector<std::pair<std::string, Tensor>> tensors(file.begin(), file.end());
  io::save_safetensors(out, tensors, {{"model", name}, {"devices", devices}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gpt = argc >= 2 && std::string(argv[1]).rfind("gpt", 0) == 0;
  if (argc != 6 && !(gpt && argc == 7)) {
    std::fprintf(stderr, "usage: torch_tool MODEL SHAPE BATCH SEED OUT\n"
                         "       torch_tool gpt:KEY=VALUE,... T BATCH SEED OUT [DEVICES]\n");
    return 2;
  }
  try {
    if (gpt)
      return run_gpt(argv[1], std::stoll(argv[2]), std::stoll(argv[3]), std::stoull(argv[4]), argv[5],
                     argc == 7 ? argv[6] : "cpu");
    return run(argv[1], argv[2], std::stoll(argv[3]), std::stoull(argv[4]), argv[5]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_tool: %s\n", e.what());
    return 1;
  }
}
