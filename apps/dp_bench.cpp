// dp-bench, two modes.
// Step mode (default): time per training step of one model on the plain
// single-device engine, on the DataParallel engine over the primary alone
// (the engine's own overhead), on DataParallel over every listed device, and
// on DDP with one process per listed device (workers of dp-bench itself,
// started through the launcher), at one global batch. Inputs are seeded
// random host tensors, so the loader is not timed. Each configuration:
// warm-up steps, then `repeats` timed runs of `steps` steps, interleaved
// across the in-process configurations (the DDP processes run theirs after
// them); the median run is reported.
// Epoch mode (--epochs N): whole epochs of real data, fanout's modes beside
// PyTorch's (dp_bench_epochs.h).
#include <boost/program_options.hpp>
#include <unistd.h>
#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli_main.h"
#include "apps/dp_bench_epochs.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/distributed/launcher.h"
#include "runtime/core/precision.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/optim/grad_scaler.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/sharded_optimizer.h"
#include "runtime/train/trainer.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

struct Options {
  std::string model, input, devices, json, comm, ddp_result;
  bool no_ddp = false;
  int64_t batch_size = 256;
  int warmup = 5, steps = 20, repeats = 3;
  uint64_t seed = 0;
  std::string seed_text = "0";  // --seed as given (parsed into seed)
  bool split_invariant = false, allow_tf32 = false, cudnn_benchmark = false;
  int cpu_threads = 0;  // CPU devices: threads per device's kernels (0: its share of the cores)
  // The optimizer every configuration steps (dp-train's flags; momentum 0.9
  // and weight decay 5e-4 as its defaults).
  std::string optimizer = "sgd", betas = "0.9,0.999";
  double eps = 1e-8;
  bool amsgrad = false, no_decay_norm_bias = false;
  double clip_grad_norm = 0;
  float clip_grad_value = 0;
  std::string precision = "32";
  std::string grad_reduce_dtype = "fp32";
  bool shard_optimizer = false;
  std::string cuda_graphs = "auto";
  // 16-mixed's loss scaler for one configuration (null otherwise).
  std::unique_ptr<optim::GradScaler> make_scaler() const {
    if (parse_precision(precision) != Precision::F16Mixed) return nullptr;
    return std::make_unique<optim::GradScaler>();
  }
  optim::OptimizerOptions optimizer_options() const {
    optim::OptimizerOptions h;
    h.kind = optim::parse_optimizer(optimizer);
    h.lr = lr();
    h.momentum = h.kind == optim::OptimizerKind::SGD ? 0.9f : 0.0f;
    h.weight_decay = 5e-4f;
    h.no_decay_norm_bias = no_decay_norm_bias;
    std::tie(h.beta1, h.beta2) = apps::parse_betas(betas);
    h.eps = eps;
    h.amsgrad = amsgrad;
    return h;
  }
  // Step mode's constant rate: 0.01 for SGD, 1e-3 for Adam and AdamW (a rate
  // that trains: a diverging one fills the activations with subnormals, which
  // slow the CPU down and would time that instead).
  float lr() const { return optimizer == "sgd" ? 0.01f : 1e-3f; }
};


// A GPT preset that takes its vocabulary from the data (gpt-char) gets
// shakespeare_char's 65 characters here; gpt2 keeps its 50304.
constexpr int kBenchVocab = 65;

// The classes (or heatmap channels, or a GPT's data vocabulary) each model is built with.
int model_classes(const std::string& model) {
  if (models::is_gpt(model)) return kBenchVocab;
  return models::dense_output(model) ? 4 : 10;
}

models::GPTConfig gpt_config(const std::string& model) {
  return models::parse_gpt_config(models::gpt_spec(model), kBenchVocab);
}

// Seeded targets for `model`'s output on a batch of `in`: class labels, or
// dense heatmap-like targets (noise and one peak per channel) when the
// output is more than (N, classes).
struct Targets {
  Tensor y;
  LossOptions loss;
};
Targets make_targets(const std::string& model, const Shape& in, int64_t batch, uint64_t seed, std::mt19937_64& rng) {
  if (models::is_gpt(model)) {  // next-token ids, each position's
    const int64_t v = gpt_config(model).vocab_size;
    Targets t;
    t.loss.criterion = CriterionKind::TokenCrossEntropy;
    t.y = Tensor::empty(Shape{batch, in[0]}, DType::I32);
    for (int64_t i = 0; i < t.y.numel(); ++i) t.y.data<int32_t>()[i] = static_cast<int32_t>(rng() % v);
    return t;
  }
  auto m = models::make_model(model, in, model_classes(model), seed);
  m->train(false);
  Context ctx(Device::cpu(), seed);
  Shape one;
  one.ndim = in.ndim + 1;
  one.d[0] = 1;
  for (int i = 0; i < in.ndim; ++i) one.d[i + 1] = in.d[i];
  Tensor probe = Tensor::empty(one);
  probe.fill(0.5f);
  Shape out = m->forward(probe, ctx).shape();
  out[0] = batch;
  Targets t;
  if (out.ndim == 2) {
    t.y = Tensor::empty(Shape{batch}, DType::I32);
    for (int64_t i = 0; i < batch; ++i) t.y.data<int32_t>()[i] = static_cast<int32_t>(rng() % out[1]);
    return t;
  }
  t.loss.criterion = CriterionKind::Mse;
  t.y = Tensor::empty(out);
  std::uniform_real_distribution<float> u(0.0f, 0.05f);
  for (int64_t i = 0; i < t.y.numel(); ++i) t.y.f32()[i] = u(rng);
  const int64_t planes = out[0] * out[1], plane = t.y.numel() / planes;
  for (int64_t p = 0; p < planes; ++p) t.y.f32()[p * plane + static_cast<int64_t>(rng() % plane)] = 1.0f;
  return t;
}

struct Result {
  std::string config;
  double ms_per_step = 0, images_per_second = 0;
  double tokens_per_second = 0;  // GPT: samples x T per second
  double mfu = -1;               // GPT on GPUs of known peak: model FLOP utilization; -1: not known
  int64_t bytes_to_primary = -1;  // per step; -1: not measured (DDP)
  int64_t state_bytes = -1;       // optimizer state on the device holding the most (DDP: on rank 0's); -1: not measured
  int64_t summed_bytes = -1;      // DDP: bytes rank 0 put into summing collectives per step; -1: not DDP
  std::string graphs;             // CUDA graphs: "N captured, M replayed" or "off: why"
};

// One configuration under test: its model and engine (whose contexts hold
// their kernel threads: each replica's share of the cores).
struct Config {
  std::string name;
  std::unique_ptr<Module> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::GradScaler> scaler;
  std::vector<double> runs;  // seconds per step
  int64_t bytes_to_primary = -1;
  int64_t state_bytes = -1;   // DDP: what rank 0's workers measured
  int64_t summed_bytes = -1;  // DDP: per step, rank 0's
};

std::string graphs_summary(const Engine& e) {
  const GraphStats g = e.graph_stats();
  if (!g.on && g.captures == 0) return "off: " + g.off_reason;
  std::string s = std::to_string(g.captures) + " captured, " + std::to_string(g.replays) + " replayed";
  if (!g.on) s += "; then off: " + g.off_reason;
  return s;
}

// The optimizer state bytes of the device that holds the most (a sharded
// optimizer's largest shard; else all of it, on the primary).
int64_t max_state_bytes(optim::Optimizer& opt) {
  const std::vector<int64_t> b = opt.state_bytes();
  return b.empty() ? 0 : *std::max_element(b.begin(), b.end());
}

double time_steps(Engine& eng, optim::Optimizer& opt, optim::GradScaler* scaler, const Tensor& x, const Tensor& y,
                  int steps, float lr, const Options& o);

// A DDP worker (started by run() through the launcher): its share of the
// batch, the same warm-up and timed runs, aligned across ranks by barriers;
// rank 0 writes the seconds per step of each run to `o.ddp_result`.
int ddp_worker(const Options& o, const Tensor& x, const Tensor& y, const LossOptions& loss, const MathOptions& math,
               const Shape& in) {
  const distributed::WorkerEnv env = distributed::worker_env();
  FANOUT_USER_CHECK(env.present) << "--ddp-result is dp-bench's own, for its DDP workers";
  const int64_t local = o.batch_size / env.world_size;
  EngineSpec spec;
  spec.devices = split_devices(parse_devices(o.devices), env.local_world_size, env.local_rank);
  spec.loss = loss;
  spec.dp.seed = o.seed;
  spec.dp.math = math;
  spec.dp.grad_reduce_dtype = parse_grad_reduce_dtype(o.grad_reduce_dtype);
  spec.dp.shard_optimizer = o.shard_optimizer;
  spec.cuda_graphs = parse_cuda_graphs(o.cuda_graphs);
  spec.local_processes = env.local_world_size;
  spec.group = make_process_group({env.rank, env.world_size, env.rendezvous, env.run_id, 300}, "auto", spec.devices,
                                  gpus_shared_by_processes(parse_devices(o.devices), env.local_world_size));
  auto model = models::make_model(o.model, in, model_classes(o.model), o.seed);
  const distributed::ProcessGroup& group = *spec.group;  // the engine's from here on
  auto engine = make_engine(*model, std::move(spec));
  auto opt = train::make_engine_optimizer(*engine, o.optimizer_options());
  auto scaler = o.make_scaler();
  const Tensor xs = x.slice(env.rank * local, (env.rank + 1) * local);
  const Tensor ys = y.slice(env.rank * local, (env.rank + 1) * local);
  time_steps(*engine, *opt, scaler.get(), xs, ys, o.warmup, o.lr(), o);
  std::vector<double> runs;
  const int64_t summed_before = group.summed_bytes();
  for (int r = 0; r < o.repeats; ++r) {
    engine->barrier("barrier before a timed run");
    runs.push_back(time_steps(*engine, *opt, scaler.get(), xs, ys, o.steps, o.lr(), o));
  }
  const int64_t summed = (group.summed_bytes() - summed_before) / (static_cast<int64_t>(o.repeats) * o.steps);
  if (env.rank == 0) {
    std::ofstream f(o.ddp_result);
    f << nlohmann::json{{"runs", runs}, {"state_bytes", max_state_bytes(*opt)}, {"summed_bytes", summed}}.dump()
      << "\n";
    FANOUT_USER_CHECK(f.good()) << "cannot write " << o.ddp_result;
  }
  return 0;
}

// Whether the command line (not a default) set `name`.
bool given(const po::variables_map& vm, const char* name) { return vm.count(name) && !vm[name].defaulted(); }

double time_steps(Engine& eng, optim::Optimizer& opt, optim::GradScaler* scaler, const Tensor& x, const Tensor& y,
                  int steps, float lr, const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps && !apps::g_interrupted; ++i)  // each step ends with its loss on the host
    train::train_step(eng, opt, x, y, lr, o.clip_grad_norm, o.clip_grad_value, scaler);
  return steps > 0 ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps : 0;
}

// dp-bench's options, into o (both modes) and e (epoch mode's own).
void describe(po::options_description& desc, Options& o, apps::EpochBenchOptions& e) {
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&o.model)->default_value("lenet"),
     "mlp, lenet, cnn, resnet18, resnet18:imagenet, heatmap3d (dense targets, mean squared error), or "
     "gpt:PRESET,KEY=VALUE,... (gpt2, gpt-char with 65 tokens; nanoGPT's GPTConfig keys; reports tokens/s and, on "
     "H100/H200/A100, MFU by nanoGPT's estimate)")
    ("input", po::value(&o.input)->default_value("1x28x28"),
     "sample shape CxHxW, or CxDxHxW for heatmap3d; a GPT's sequence length T (default its block_size)")
    ("batch-size", po::value(&o.batch_size)->default_value(256), "global batch size")
    ("devices", po::value(&o.devices)->default_value("cpu:2"),
     "devices for the DataParallel run (cpu:N, 0,0, cuda:0,cuda:1, ...); the first is the primary")
    ("dp-comm", po::value(&o.comm)->default_value("auto"), "gradient reduction: auto; GPUs nccl or p2p; CPU devices cpu")
    ("warmup", po::value(&o.warmup)->default_value(5), "untimed steps per configuration")
    ("steps", po::value(&o.steps)->default_value(20), "timed steps per run")
    ("repeats", po::value(&o.repeats)->default_value(3), "timed runs per configuration (the median is reported)")
    ("seed", po::value(&o.seed_text)->default_value("0"), "seed for weights and inputs (0..2^64-1)")
    ("split-invariant", po::bool_switch(&o.split_invariant),
     "every configuration with split-invariant math (CPU devices; see dp-train --help)")
    ("cpu-threads", po::value(&o.cpu_threads)->default_value(0),
     "CPU devices: threads for each device's kernels in every configuration (0: its share of the cores)")
    ("allow-tf32", po::bool_switch(&o.allow_tf32), "TF32 tensor cores for matrix products and convolutions (CUDA)")
    ("cudnn-benchmark", po::bool_switch(&o.cudnn_benchmark), "search for the fastest cuDNN algorithms (CUDA)")
    ("no-ddp", po::bool_switch(&o.no_ddp), "skip the DDP configuration (one process per listed device)")
    ("json", po::value(&o.json), "append one JSON object per configuration to this file")
    ("optimizer", po::value(&o.optimizer)->default_value(o.optimizer),
     "sgd (momentum 0.9, lr 0.01), adam or adamw (lr 1e-3); weight decay 5e-4")
    ("betas", po::value(&o.betas)->default_value(o.betas), "Adam/AdamW: BETA1,BETA2")
    ("eps", po::value(&o.eps)->default_value(o.eps, "1e-08"), "Adam/AdamW: the denominator's epsilon")
    ("amsgrad", po::bool_switch(&o.amsgrad), "Adam/AdamW: the AMSGrad variant")
    ("no-decay-norm-bias", po::bool_switch(&o.no_decay_norm_bias), "no weight decay on biases and 1-D parameters")
    ("clip-grad-norm", po::value(&o.clip_grad_norm)->default_value(0, "0"),
     "clip the reduced gradient's total norm before each step (0: off)")
    ("clip-grad-value", po::value(&o.clip_grad_value)->default_value(0, "0"),
     "clamp the reduced gradient's elements into [-V, V] before each step (0: off)")
    ("precision", po::value(&o.precision)->default_value(o.precision),
     "32, bf16-mixed or 16-mixed (loss scaling), as dp-train's; PyTorch's rows run under torch.autocast "
     "(+ GradScaler) alike. On CPU devices bf16-mixed multiplies in bfloat16 where the CPU has bfloat16 "
     "instructions (AVX-512 BF16, AMX); elsewhere, and 16-mixed everywhere, the products run in float32")
    ("shard-optimizer", po::bool_switch(&o.shard_optimizer),
     "dp-train's --shard-optimizer (ZeRO-1) in the DataParallel rows over several devices and the DDP row")
    ("grad-reduce-dtype", po::value(&o.grad_reduce_dtype)->default_value(o.grad_reduce_dtype),
     "fp32, or bf16: gradient buckets rounded to bfloat16 around each reduction, as dp-train's (PyTorch's DDP "
     "rows: bf16_compress_hook)")
    ("cuda-graphs", po::value(&o.cuda_graphs)->default_value(o.cuda_graphs),
     "auto: on a GPU every engine replays its training steps from CUDA graphs (and a second plain row runs "
     "without); off: plain launches only; check: dp-train's. Epoch mode passes it to dp-train");
  po::options_description epochs("Epoch mode (each run a fresh process: dp-train, or bench/pytorch/train_epochs.py)");
  epochs.add_options()
    ("epochs", po::value(&e.epochs), "epoch mode: train N epochs per run")
    ("data", po::value(&e.data)->default_value(e.data),
     "fashion-mnist, fashion-mnist:DIR, cifar10:DIR or synthetic[:N] (3x32x32 images); keypoints3d:DIR or "
     "synthetic3d[:N] (heatmap3d's volumes); the data sets the sample shape. "
     "A --model gpt:... reads token data as dp-train does: tokens:DIR, text:FILE or text-bytes:FILE (tokens/s)")
    ("lr", po::value(&e.lr)->default_value(e.lr, "0.02"), "learning rate (constant; SGD momentum 0.9, weight decay 5e-4)")
    ("workers", po::value(&e.workers)->default_value(e.workers), "loader threads per process (PyTorch: worker processes)")
    ("plot", po::value(&e.plot), "draw epoch time per configuration into this PNG (Python with matplotlib)")
    ("python", po::value(&e.python)->default_value(e.python), "the Python that runs PyTorch and the plot")
    ("no-pytorch", po::bool_switch(&e.no_pytorch), "leave PyTorch's rows out");
  desc.add(epochs);
  // clang-format on
}

// Parses argv into o and e; false after printing --help.
bool parse(int argc, char** argv, Options& o, apps::EpochBenchOptions& e, po::variables_map& vm) {
  po::options_description desc(
      "dp-bench: is DataParallel slower than DDP? Training time of one model on one device, DataParallel over\n"
      "the listed devices and DDP with one process per device (and the hybrid), fanout beside PyTorch.\n\n"
      "Usage: dp-bench [options]            step mode: time per step on random inputs\n"
      "       dp-bench --epochs N [options] epoch mode: whole epochs of real data through the loader\n\nOptions");
  describe(desc, o, e);
  po::options_description hidden;
  hidden.add_options()("ddp-result", po::value(&o.ddp_result), "internal: a DDP worker writes its timings here");
  po::options_description all;
  all.add(desc).add(hidden);
  po::store(apps::parse_command_line(argc, argv, all), vm);
  if (vm.count("help")) {
    std::cout << desc
              << "\nIn epoch mode --warmup is the steps at the start of each epoch left out of its time, --repeats the\n"
                 "runs per configuration (interleaved; the median is reported).\n"
                 "\nExamples:\n  dp-bench --model lenet --batch-size 256 --devices cpu:2\n"
                 "  dp-bench --epochs 1 --model cnn --batch-size 128 --devices cpu:2 --json r.jsonl --plot r.png\n"
                 "  dp-bench --model gpt:gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64,dropout=0 --batch-size 12 "
                 "--optimizer adamw\n";
    return false;
  }
  po::notify(vm);
  o.seed = apps::parse_seed(o.seed_text);
  return true;
}

// Checks what both modes share; returns the precision.
Precision check_common(const Options& o) {
  o.optimizer_options();  // an unknown --optimizer is an error before any run
  const Precision precision = parse_precision(o.precision);
  const DType reduce_dtype = parse_grad_reduce_dtype(o.grad_reduce_dtype);
  parse_cuda_graphs(o.cuda_graphs);  // a one-line error before any work
  FANOUT_USER_CHECK(reduce_dtype == DType::F32 || !o.split_invariant)
      << "--grad-reduce-dtype " << o.grad_reduce_dtype << " cannot keep --split-invariant's exact gradient sums";
  FANOUT_USER_CHECK(precision == Precision::F32 || !o.split_invariant)
      << "--precision " << o.precision << " cannot keep --split-invariant's exactness; use one or the other";
  FANOUT_USER_CHECK(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0)
      << "--clip-grad-norm must be non-negative, got " << o.clip_grad_norm;
  FANOUT_USER_CHECK(o.cpu_threads >= 0 && o.cpu_threads <= 1024)
      << "--cpu-threads must be in 0..1024 (0: each device's share of the cores), got " << o.cpu_threads;
  FANOUT_USER_CHECK(std::isfinite(o.clip_grad_value) && o.clip_grad_value >= 0)
      << "--clip-grad-value must be non-negative, got " << o.clip_grad_value;
  return precision;
}

// Epoch mode's options: e plus what the two modes share.
apps::EpochBenchOptions epoch_options(const po::variables_map& vm, const Options& o, apps::EpochBenchOptions e,
                                      Precision precision) {
  for (const char* step_only : {"input", "steps", "dp-comm"})
    FANOUT_USER_CHECK(!given(vm, step_only)) << "--" << step_only << " is for step mode, not with --epochs";
  e.model = o.model;
  e.devices = o.devices;
  e.batch_size = o.batch_size;
  e.repeats = o.repeats;
  e.warmup = o.warmup;
  e.seed = o.seed;
  e.json = o.json;
  e.no_ddp = o.no_ddp;
  e.split_invariant = o.split_invariant;
  e.cpu_threads = o.cpu_threads;
  e.allow_tf32 = o.allow_tf32;
  e.cudnn_benchmark = o.cudnn_benchmark;
  e.optimizer = o.optimizer;
  e.no_decay_norm_bias = o.no_decay_norm_bias;
  e.clip_grad_norm = o.clip_grad_norm;
  e.clip_grad_value = o.clip_grad_value;
  e.betas = o.betas;
  e.eps = o.eps;
  e.amsgrad = o.amsgrad;
  e.precision = precision_name(precision);
  e.grad_reduce_dtype = o.grad_reduce_dtype;
  e.shard_optimizer = o.shard_optimizer;
  e.cuda_graphs = o.cuda_graphs;
  return e;
}

void check_step_options(const po::variables_map& vm, const Options& o) {
  for (const char* epoch_only : {"data", "lr", "workers", "plot", "python", "no-pytorch"})
    FANOUT_USER_CHECK(!given(vm, epoch_only)) << "--" << epoch_only << " is for epoch mode (--epochs N)";
  FANOUT_USER_CHECK(o.batch_size > 0) << "--batch-size must be positive, got " << o.batch_size;
  FANOUT_USER_CHECK(o.warmup >= 0) << "--warmup must be non-negative, got " << o.warmup;
  FANOUT_USER_CHECK(o.steps > 0) << "--steps must be positive, got " << o.steps;
  FANOUT_USER_CHECK(o.repeats > 0) << "--repeats must be positive, got " << o.repeats;
  if (!o.json.empty()) apps::check_output_file("--json", o.json);
}

// A GPT's samples are T token ids (--input T; block_size when not given),
// other models' images CxHxW or volumes CxDxHxW.
Shape sample_shape(const Options& o) {
  if (!models::is_gpt(o.model)) return apps::parse_input(o.input);
  const int64_t block = gpt_config(o.model).block_size;
  if (o.input.empty()) return Shape{block};
  int64_t t = 0;
  const auto [end, ec] = std::from_chars(o.input.data(), o.input.data() + o.input.size(), t);
  FANOUT_USER_CHECK(ec == std::errc() && end == o.input.data() + o.input.size() && t >= 1)
      << "bad --input '" << o.input << "' for a GPT (expected the sequence length T, e.g. 256)";
  FANOUT_USER_CHECK(t <= block) << "gpt: a sequence of " << t << " tokens is longer than block_size " << block;
  return Shape{t};
}

// The batch: inputs uniform in [-1, 1), or a GPT's token ids uniform over its vocabulary.
Tensor random_batch(const Options& o, const Shape& in, int64_t batch, std::mt19937_64& rng) {
  if (models::is_gpt(o.model)) {
    const int64_t v = gpt_config(o.model).vocab_size;
    Tensor x = Tensor::empty(Shape{batch, in[0]}, DType::I32);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<int32_t>()[i] = static_cast<int32_t>(rng() % v);
    return x;
  }
  Shape xs;
  xs.ndim = in.ndim + 1;
  xs.d[0] = batch;
  for (int i = 0; i < in.ndim; ++i) xs.d[i + 1] = in.d[i];
  Tensor x = Tensor::empty(xs);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = u(rng);
  return x;
}

MathOptions math_of(const Options& o, Precision precision) {
  MathOptions math;
  math.split_invariant = o.split_invariant;
  math.cpu_threads = o.cpu_threads;
  math.allow_tf32 = o.allow_tf32;
  math.cudnn_benchmark = o.cudnn_benchmark;
  math.autocast = autocast_dtype(precision);
  return math;
}

// The plain single-device engine, then DataParallel over the primary alone
// and over every device with the loss on the replicas and with the outputs
// gathered (PyTorch's way).
std::vector<Config> local_configs(const Options& o, const Shape& in, const std::vector<Device>& devices,
                                  const LossOptions& loss, const MathOptions& math) {
  const Device primary = devices[0];
  std::vector<Config> configs;
  // On a GPU with --cuda-graphs auto, the plain engine twice: with CUDA
  // graphs and with plain launches.
  const CudaGraphs graphs = parse_cuda_graphs(o.cuda_graphs);
  std::vector<CudaGraphs> plain_runs = {graphs};
  if (primary.is_cuda() && graphs == CudaGraphs::Auto) plain_runs.push_back(CudaGraphs::Off);
  for (CudaGraphs g : plain_runs) {
    Config c;
    c.name = "plain " + primary.str() + (plain_runs.size() > 1 && g == CudaGraphs::Off ? " no graphs" : "");
    c.model = models::make_model(o.model, in, model_classes(o.model), o.seed);
    EngineSpec spec;
    spec.devices = {primary};
    spec.loss = loss;
    spec.dp.seed = o.seed;
    spec.dp.math = math;
    spec.cuda_graphs = g;
    c.engine = make_engine(*c.model, std::move(spec));
    configs.push_back(std::move(c));
  }
  struct DpRun {
    std::vector<Device> devices;
    bool on_replicas;
  };
  std::vector<DpRun> dp_runs = {{{primary}, true}};
  if (devices.size() > 1) {
    dp_runs.push_back({devices, true});
    dp_runs.push_back({devices, false});
  }
  for (auto& run : dp_runs) {
    Config c;
    for (auto& d : run.devices) c.name += (c.name.empty() ? "dp " : ",") + d.str();
    if (run.devices.size() > 1) c.name += run.on_replicas ? " loss on replicas" : " gathered";
    c.model = models::make_model(o.model, in, model_classes(o.model), o.seed);
    EngineSpec spec;
    spec.devices = run.devices;
    spec.loss = loss;
    spec.force_data_parallel = true;
    DataParallelOptions& dpo = spec.dp;
    dpo.seed = o.seed;
    dpo.comm = o.comm;
    dpo.math = math;
    dpo.grad_reduce_dtype = parse_grad_reduce_dtype(o.grad_reduce_dtype);
    dpo.shard_optimizer = o.shard_optimizer && run.devices.size() > 1;
    if (dpo.shard_optimizer) c.name += ", sharded";
    dpo.loss_on_replicas = run.on_replicas;
    spec.cuda_graphs = graphs;
    c.engine = make_engine(*c.model, std::move(spec));
    configs.push_back(std::move(c));
  }
  return configs;
}

// Warms each configuration up, then interleaves the timed runs so that drift
// in the machine's speed spreads over every configuration alike. SIGINT or
// SIGTERM stops it; a run it cut short is dropped.
void time_configs(const Options& o, std::vector<Config>& configs, Tensor& x, const Tensor& y) {
  for (auto& c : configs) {
    c.opt = train::make_engine_optimizer(*c.engine, o.optimizer_options());
    c.scaler = o.make_scaler();
    time_steps(*c.engine, *c.opt, c.scaler.get(), x, y, o.warmup, o.lr(), o);
  }
  for (int r = 0; r < o.repeats; ++r)
    for (auto& c : configs) {
      const double sec = time_steps(*c.engine, *c.opt, c.scaler.get(), x, y, o.steps, o.lr(), o);
      if (apps::g_interrupted) return;
      c.runs.push_back(sec);
      if (c.engine->bytes_to_primary() >= 0) c.bytes_to_primary = c.engine->bytes_to_primary();
    }
}

// DDP: one process per listed device, each with its share of the batch; the
// workers are dp-bench itself with --ddp-result.
// Returns no runs when SIGINT or SIGTERM stopped the workers (the launcher said so in one line).
Config ddp_config(const Options& o, const std::vector<Device>& devices, int argc, char** argv) {
  char tmpl[] = "/tmp/dp-bench-ddp-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  FANOUT_USER_CHECK(fd >= 0) << "cannot create a temporary file for the DDP timings";
  ::close(fd);
  distributed::LaunchOptions lo;
  lo.program = apps::self_path();
  lo.args.assign(argv + 1, argv + argc);
  lo.args.push_back("--ddp-result");
  lo.args.push_back(tmpl);
  lo.nproc_per_node = static_cast<int>(devices.size());
  lo.name = "dp-bench";
  const int rc = distributed::launch(lo);
  std::ifstream f(tmpl);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ::unlink(tmpl);
  Config c;
  c.name = "ddp " + std::to_string(devices.size()) + " processes x " + (devices[0].is_cpu() ? "cpu" : "1 GPU");
  if (o.shard_optimizer) c.name += ", sharded";
  // The launcher returns 128 + the signal it passed on to the workers.
  if (rc == 128 + SIGINT || rc == 128 + SIGTERM) {
    apps::g_interrupted = rc - 128;
    return c;
  }
  FANOUT_USER_CHECK(rc == 0 && j.is_object() && j.contains("runs") && !j["runs"].empty())
      << "the DDP workers failed (exit status " << rc << ")";
  for (auto& v : j["runs"]) c.runs.push_back(v.get<double>());
  c.state_bytes = j.value("state_bytes", int64_t{-1});
  c.summed_bytes = j.value("summed_bytes", int64_t{-1});
  return c;
}

// A GPT step's work: tokens per sample and nanoGPT's estimate_mfu FLOPs per
// sample (6 N + 12 L H Q T per token, N without the position embedding, Q
// the head size), and the dense peak of the devices for the precision (0
// where unknown: CPU devices, GPUs not listed here).
struct StepWork {
  int64_t tokens_per_sample = 0;
  double flops_per_sample = 0, peak_flops = 0;
};

// Dense peaks (FLOP/s, SXM boards) by GPU name: bf16/fp16 tensor cores, TF32, float32.
double gpu_peak(const std::string& name, Precision p, bool tf32) {
  struct Peak {
    const char* key;
    double half, tf32, f32;
  };
  const Peak peaks[] = {{"H200", 989.4e12, 494.7e12, 66.9e12},
                        {"H100", 989.4e12, 494.7e12, 66.9e12},
                        {"A100", 312e12, 156e12, 19.5e12}};
  for (const Peak& k : peaks)
    if (name.find(k.key) != std::string::npos) return p != Precision::F32 ? k.half : tf32 ? k.tf32 : k.f32;
  return 0;
}

StepWork step_work(const Options& o, const Shape& in, Precision precision, const std::vector<Device>& devices) {
  StepWork w;
  if (!models::is_gpt(o.model)) return w;
  const models::GPTConfig c = gpt_config(o.model);
  const int64_t t = in[0];
  const double n = static_cast<double>(models::GPT(c).num_non_embedding_parameters());
  w.tokens_per_sample = t;
  w.flops_per_sample =
      (6.0 * n + 12.0 * static_cast<double>(c.n_layer * c.n_head * (c.n_embd / c.n_head) * t)) * static_cast<double>(t);
  if (devices[0].is_cuda()) {
    const std::vector<CudaDeviceInfo> info = cuda_device_info();
    std::vector<int> seen;
    for (const Device& d : devices) {
      if (std::find(seen.begin(), seen.end(), d.index) != seen.end()) continue;  // "0,0" is one GPU
      seen.push_back(d.index);
      const double peak = d.index < static_cast<int>(info.size()) ? gpu_peak(info[d.index].name, precision, o.allow_tf32) : 0;
      if (peak == 0) return {w.tokens_per_sample, w.flops_per_sample, 0};
      w.peak_flops += peak;
    }
  }
  return w;
}

std::vector<Result> medians(const Options& o, std::vector<Config>& configs) {
  std::vector<Result> results;
  for (auto& c : configs) {
    std::sort(c.runs.begin(), c.runs.end());
    const double sec = c.runs[c.runs.size() / 2];
    results.push_back({c.name, 1e3 * sec, o.batch_size / sec, 0, -1, c.bytes_to_primary,
                       c.opt ? max_state_bytes(*c.opt) : c.state_bytes, c.summed_bytes,
                       c.engine ? graphs_summary(*c.engine) : "DDP workers: not counted here"});
  }
  return results;
}

// "to primary": bytes a step moves onto the primary from the other replicas
// (outputs and their targets gathered, or the replicas' loss sums). "opt
// state B": optimizer state on the device holding the most. "summed B": DDP,
// bytes a rank puts into summing collectives per step (gradient buckets; half
// as many with --grad-reduce-dtype bf16).
// A GPT's rows give tokens/s (and MFU where the peak is known) in place of images/s.
void print_results(const std::vector<Result>& results, const StepWork& w) {
  auto bytes = [](int64_t b) { return b < 0 ? std::string("-") : std::to_string(b); };
  const bool tokens = w.tokens_per_sample > 0;
  std::printf("%-44s %12s %14s %10s %14s %14s %12s%s\n", "configuration", "ms/step", tokens ? "tokens/s" : "images/s",
              "vs plain", "to primary B", "opt state B", "summed B", w.peak_flops > 0 ? "      MFU" : "");
  for (auto& r : results) {
    std::printf("%-44s %12.3f %14.0f %9.3fx %14s %14s %12s", r.config.c_str(), r.ms_per_step,
                tokens ? r.tokens_per_second : r.images_per_second, results[0].ms_per_step / r.ms_per_step,
                bytes(r.bytes_to_primary).c_str(), bytes(r.state_bytes).c_str(), bytes(r.summed_bytes).c_str());
    if (r.mfu >= 0) std::printf(" %7.1f%%", 100 * r.mfu);
    std::printf("\n");
  }
  for (auto& r : results)
    if (r.config.find("cuda") != std::string::npos && r.graphs.rfind("DDP", 0) != 0)
      std::printf("CUDA graphs, %s: %s\n", r.config.c_str(), r.graphs.c_str());
}

void write_json(const Options& o, const Shape& in, Precision precision, const std::vector<Result>& results) {
  std::ofstream f(o.json, std::ios::app);
  FANOUT_USER_CHECK(f.good()) << "cannot open --json " << o.json << ": " << std::strerror(errno);
  for (auto& r : results)
    f << nlohmann::json{{"model", o.model},       {"batch_size", o.batch_size},   {"input", in.str()},
                        {"config", r.config},      {"ms_per_step", r.ms_per_step}, {"images_per_second", r.images_per_second},
                        {"speedup_vs_plain", results[0].ms_per_step / r.ms_per_step},
                        {"split_invariant", o.split_invariant}, {"cpu_threads", o.cpu_threads}, {"allow_tf32", o.allow_tf32},
                        {"cudnn_benchmark", o.cudnn_benchmark}, {"devices", o.devices},
                        {"bytes_to_primary", r.bytes_to_primary}, {"optimizer", o.optimizer},
                        {"clip_grad_norm", o.clip_grad_norm}, {"clip_grad_value", o.clip_grad_value},
                        {"betas", o.betas}, {"eps", o.eps}, {"amsgrad", o.amsgrad},
                        {"no_decay_norm_bias", o.no_decay_norm_bias}, {"precision", precision_name(precision)},
                        {"grad_reduce_dtype", o.grad_reduce_dtype}, {"shard_optimizer", o.shard_optimizer},
                        {"optimizer_state_bytes_max_device", r.state_bytes},
                        {"summed_bytes_per_step", r.summed_bytes},
                        {"tokens_per_second", r.tokens_per_second}, {"mfu", r.mfu},
                        {"cuda_graphs", r.graphs}}
             .dump()
      << "\n";
  f.flush();
  FANOUT_USER_CHECK(f.good()) << "cannot write --json " << o.json << ": " << std::strerror(errno);
}

// Step mode: time per step on one seeded random batch (or, with
// --ddp-result, one DDP worker of it).
int run_steps(const Options& o, Precision precision, int argc, char** argv) {
  const Shape in = sample_shape(o);
  const std::vector<Device> devices = parse_devices(o.devices);
  std::mt19937_64 rng(o.seed);
  Tensor x = random_batch(o, in, o.batch_size, rng);
  const Targets targets = make_targets(o.model, in, o.batch_size, o.seed, rng);
  const MathOptions math = math_of(o, precision);
  if (!o.ddp_result.empty()) return ddp_worker(o, x, targets.y, targets.loss, math, in);
  const bool ddp = devices.size() > 1 && !o.no_ddp;
  FANOUT_USER_CHECK(!ddp || o.batch_size % static_cast<int64_t>(devices.size()) == 0)
      << "--batch-size " << o.batch_size << " cannot be split evenly over " << devices.size()
      << " DDP processes (or pass --no-ddp)";
  std::printf("dp-bench: %s, batch %lld of %s, %d warm-up + %d x %d timed steps, %d host cores%s%s%s%s\n",
              o.model.c_str(), static_cast<long long>(o.batch_size), in.str().c_str(), o.warmup, o.repeats, o.steps,
              host_cores(), o.split_invariant ? ", split-invariant math" : "", o.allow_tf32 ? ", TF32" : "",
              o.cudnn_benchmark ? ", cuDNN benchmark" : "",
              precision == Precision::F32 ? "" : (std::string(", precision ") + precision_name(precision)).c_str());
  std::fflush(stdout);
  apps::InterruptGuard guard;  // SIGINT, SIGTERM: the finished rows still reach the table and --json
  std::vector<Config> configs = local_configs(o, in, devices, targets.loss, math);
  const int total = o.repeats * static_cast<int>(configs.size() + (ddp ? 1 : 0));
  time_configs(o, configs, x, targets.y);
  if (apps::g_interrupted) {  // in this process (the launcher says its own line for the DDP workers)
    int finished = 0;
    for (auto& c : configs) finished += static_cast<int>(c.runs.size());
    apps::print_interrupted(apps::g_interrupted, finished, total, "timed runs");
  } else if (ddp) {
    configs.push_back(ddp_config(o, devices, argc, argv));
  }
  std::erase_if(configs, [](const Config& c) { return c.runs.empty(); });
  if (configs.empty()) return 128 + apps::g_interrupted;
  std::vector<Result> results = medians(o, configs);
  const StepWork work = step_work(o, in, precision, devices);
  for (Result& r : results) {
    r.tokens_per_second = r.images_per_second * static_cast<double>(work.tokens_per_sample);
    if (work.peak_flops > 0) r.mfu = r.images_per_second * work.flops_per_sample / work.peak_flops;
  }
  print_results(results, work);
  if (!o.json.empty()) write_json(o, in, precision, results);
  return apps::g_interrupted ? 128 + apps::g_interrupted : 0;
}

int run(int argc, char** argv) {
  Options o;
  apps::EpochBenchOptions e;
  po::variables_map vm;
  if (!parse(argc, argv, o, e, vm)) return 0;
  const Precision precision = check_common(o);
  if (vm.count("epochs")) {
    return apps::run_epoch_bench(epoch_options(vm, o, e, precision));
  }
  if (models::is_gpt(o.model) && !given(vm, "input")) o.input.clear();  // block_size
  check_step_options(vm, o);
  return run_steps(o, precision, argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("dp-bench", [&] { return run(argc, argv); });
}
