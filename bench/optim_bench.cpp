// optim-bench: the optimizer step alone (no forward or backward) on a zoo
// model's arenas, for each optimizer: median milliseconds of step() plus
// zero_grad() over repeats, with random gradients, on one CPU device (no GEMM
// or convolution: the step is the fused update kernels). PyTorch's
// opt.step() on the same model: bench/pytorch/optimizer_step.py.
#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "apps/cli_main.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/optimizer.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

int run(int argc, char** argv) {
  std::string model_name = "resnet18", input = "3x32x32", which = "sgd,adam,adamw";
  int steps = 20, repeats = 5;
  double clip = 0;
  po::options_description desc("optim-bench: milliseconds of one optimizer step on a model's arenas\n\nOptions");
  desc.add_options()("help,h", "print this help and exit")(
      "model", po::value(&model_name)->default_value(model_name), "a zoo model (dp-train --model)")(
      "input", po::value(&input)->default_value(input), "sample shape CxHxW or CxDxHxW")(
      "optimizers", po::value(&which)->default_value(which), "comma list of sgd, adam, adamw")(
      "clip-grad-norm", po::value(&clip)->default_value(0, "0"), "also clip by total norm before each step")(
      "steps", po::value(&steps)->default_value(steps), "steps per repeat")(
      "repeats", po::value(&repeats)->default_value(repeats), "repeats (the median is reported)");
  po::variables_map vm;
  po::store(apps::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  po::notify(vm);
  FANOUT_USER_CHECK(steps > 0 && repeats > 0) << "--steps and --repeats must be positive";
  FANOUT_USER_CHECK(clip >= 0 && std::isfinite(clip)) << "--clip-grad-norm must be non-negative, got " << clip;
  std::vector<std::pair<std::string, optim::OptimizerKind>> kinds;  // every name checked before any is timed
  for (std::string rest = which; !rest.empty();) {
    const size_t comma = rest.find(',');
    kinds.emplace_back(rest.substr(0, comma), optim::parse_optimizer(rest.substr(0, comma)));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  auto model = models::make_model(model_name, apps::parse_input(input), 10, 1);
  Context ctx(Device::cpu());
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 1e-2f);
  std::printf("optim-bench: %s, %lld parameters, %d x %d steps, clip %g\n", model_name.c_str(),
              static_cast<long long>(model->num_parameters()), repeats, steps, clip);
  std::printf("%-10s %12s %14s\n", "optimizer", "ms/step", "ns/parameter");
  for (const auto& [name, kind] : kinds) {
    optim::OptimizerOptions o;
    o.kind = kind;
    o.lr = 1e-3f;
    o.weight_decay = 5e-4f;
    if (o.kind == optim::OptimizerKind::SGD) o.momentum = 0.9f;
    auto opt = optim::make_optimizer(*model, ctx, o);
    std::vector<double> ms;
    for (int r = 0; r < repeats + 1; ++r) {  // the first repeat warms up
      double total = 0;
      for (int s = 0; s < steps; ++s) {
        Tensor& g = model->arenas().grads;
        for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] = nd(rng);
        const auto t0 = std::chrono::steady_clock::now();
        if (clip > 0) optim::clip_grad_norm(*opt, clip);
        opt->step();
        opt->zero_grad();
        total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      }
      if (r > 0) ms.push_back(total / steps);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("%-10s %12.3f %14.3f\n", name.c_str(), med, 1e6 * med / static_cast<double>(model->num_parameters()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("optim-bench", [&] { return run(argc, argv); });
}
