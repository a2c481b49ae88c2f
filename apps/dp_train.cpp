// dp-train: trains a model-zoo network on a dataset across the given devices
// and prints a summary per epoch. With --strategy ddp it is its own launcher:
// it starts one worker of itself per process (torchrun's variables), or runs
// as one worker when a launcher (ours, torchrun, mpirun, Slurm) already set
// the rank. Bad input ends with one line on stderr and a non-zero exit status.
#include <boost/program_options.hpp>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "apps/cli_main.h"
#include "apps/test_hooks.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/data/open_data.h"
#include "runtime/distributed/launcher.h"
#include "runtime/io/safetensors.h"
#include "runtime/parallel/engine_factory.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/resume.h"
#include "runtime/train/run_config.h"
#include "runtime/train/sharded_optimizer.h"
#include "runtime/train/trainer.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

// --- parse ---------------------------------------------------------------

constexpr uintmax_t kMaxConfigBytes = 1 << 20;

// Preemption: the first SIGTERM or SIGINT asks the trainer to stop after the
// step in flight (and save); a second one ends the process at once. Repeats
// within a second are the same request: timeout(1) signals the process and
// then its group, so one timeout delivers two.
volatile sig_atomic_t g_stop_signal = 0;
timespec g_stop_at{};  // when the first arrived (CLOCK_MONOTONIC)
void on_stop_signal(int sig) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  if (g_stop_signal) {
    const int64_t ns = (int64_t{now.tv_sec} - g_stop_at.tv_sec) * 1000000000 + (now.tv_nsec - g_stop_at.tv_nsec);
    if (ns >= 1000000000) ::_exit(128 + sig);
    return;
  }
  g_stop_at = now;
  g_stop_signal = sig;
}
void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = apps::test_hooks().ignore_stop ? SIG_IGN : on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

struct Cli {
  train::RunConfig run;
  std::string betas, seed;
  bool help = false, list_devices = false;
  bool epochs_from_steps = false;  // --max-steps without --epochs: the epochs it takes, once the data is known
  std::set<std::string> given;     // the options given (on the command line or in --config), by name
};

// heatmap3d's defaults: SGD needs a large rate for the mean squared error of
// sparse heatmaps (each voxel's gradient is 2 / (K D H W) of its error), and
// no weight decay, which would otherwise outweigh those gradients.
struct HeatmapRecipe {
  float lr, weight_decay;
  int64_t batch_size;
  int epochs, heatmap_radius;
};
constexpr HeatmapRecipe kHeatmapRecipe{2.0f, 0.0f, 8, 5, 6};

template <class T>
std::string num(T v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// dp-train's options, in three parts (one table in --help): the model, data
// and optimization; seed, devices and the distributed run; loading,
// checkpoints, output and math.
void describe_training(po::options_description& desc, Cli& cli, const train::RunConfig& d) {
  train::RunConfig& o = cli.run;
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&o.model)->default_value(d.model),
     "mlp, lenet, cnn, resnet18 or resnet18:imagenet (classification); heatmap3d, or heatmap3d:group with "
     "GroupNorm for small per-device batches (keypoint volumes); gpt:PRESET,KEY=VALUE,... (a language model on "
     "token data: presets gpt2, gpt-char; nanoGPT's GPTConfig keys n_layer, n_head, n_embd, block_size, "
     "vocab_size, dropout, bias)")
    ("data", po::value(&o.data)->default_value(d.data),
     "fashion-mnist (Debian package dataset-fashion-mnist), fashion-mnist:DIR, cifar10:DIR, synthetic[:N]; "
     "keypoint volumes: keypoints3d:DIR, synthetic3d[:N]; token data for gpt: tokens:DIR (nanoGPT's train.bin "
     "and val.bin or llm.c shards by those names, DIR/meta.json), text:FILE (a character vocabulary, 90% train "
     "and 10% validation, as nanoGPT's shakespeare_char; cached in $FANOUT_CACHE_DIR or ~/.cache/fanout), "
     "text-bytes:FILE (the 256 byte values); image files: imagefolder:DIR (DIR/train/<class>/*.jpg|png and "
     "DIR/val/<class>/..., decoded by the loader workers), wds:DIR (WebDataset tar shards DIR/train-*.tar and "
     "DIR/val-*.tar: KEY.jpg or KEY.png beside KEY.cls)")
    ("tokenizer", po::value(&o.tokenizer)->default_value(d.tokenizer),
     "a byte-level BPE's folder (GPT-2's vocab.json and merges.txt, or encoder.json and vocab.bpe): text:FILE is "
     "encoded with it as nanoGPT's shakespeare prepare.py does with tiktoken's gpt2; for tokens:DIR without "
     "meta.json, the vocabulary its ids are in; either way the checkpoints carry it for dp-generate")
    ("epochs", po::value(&o.epochs)->default_value(d.epochs), "epochs to train")
    ("max-steps", po::value(&o.max_steps)->default_value(d.max_steps),
     "end the run after this many optimizer steps, inside an epoch if need be (nanoGPT's max_iters; alone, "
     "--epochs is as many as that takes) (0: --epochs decides)")
    ("eval-every", po::value(&o.eval_every)->default_value(d.eval_every),
     "also evaluate after every N optimizer steps: train and validation loss, a line and a metrics entry, and "
     "best.safetensors by it (nanoGPT's eval_interval) (0: at epoch ends only)")
    ("eval-steps", po::value(&o.eval_steps)->default_value(d.eval_steps),
     "--eval-every's validation loss on this many batches of --batch-size rows, the same rows each time, "
     "spread over the validation set (nanoGPT's eval_iters) (0: the whole set)")
    ("batch-size", po::value(&o.batch_size)->default_value(d.batch_size),
     "global batch size (split over the processes, then the devices)")
    ("eval-batch-size", po::value(&o.eval_batch_size)->default_value(d.eval_batch_size), "batch size for evaluation")
    ("accumulate", po::value(&o.accumulate)->default_value(d.accumulate),
     "batches per optimizer step (gradient accumulation; DDP reduces once per step)")
    ("optimizer", po::value(&o.optimizer)->default_value(d.optimizer),
     "sgd, adam or adamw (torch.optim's update rules)")
    ("lr", po::value(&o.lr)->default_value(d.lr, num(d.lr)), "base learning rate")
    ("momentum", po::value(&o.momentum)->default_value(d.momentum, num(d.momentum)), "SGD momentum (0 for none)")
    ("nesterov", po::bool_switch(&o.nesterov), "SGD: Nesterov momentum")
    ("betas", po::value(&cli.betas)->default_value(num(d.beta1) + "," + num(d.beta2)),
     "Adam/AdamW: BETA1,BETA2, each in [0, 1)")
    ("eps", po::value(&o.eps)->default_value(d.eps, num(d.eps)), "Adam/AdamW: term added to the denominator")
    ("amsgrad", po::bool_switch(&o.amsgrad), "Adam/AdamW: the AMSGrad variant")
    ("weight-decay", po::value(&o.weight_decay)->default_value(d.weight_decay, num(d.weight_decay)),
     "weight decay: L2 added to the gradient (sgd, adam), decoupled (adamw)")
    ("no-decay-norm-bias", po::bool_switch(&o.no_decay_norm_bias),
     "no weight decay on biases and other parameters of at most one dimension (BatchNorm weights)")
    ("clip-grad-norm", po::value(&o.clip_grad_norm)->default_value(d.clip_grad_norm, num(d.clip_grad_norm)),
     "clip the reduced gradient's total L2 norm to MAX before each step (torch's clip_grad_norm_; 0: off)")
    ("clip-grad-value", po::value(&o.clip_grad_value)->default_value(d.clip_grad_value, num(d.clip_grad_value)),
     "clamp every reduced gradient element into [-V, V] before each step (clip_grad_value_; 0: off)")
    ("lr-schedule", po::value(&o.lr_schedule)->default_value(d.lr_schedule),
     "constant, step[:STEP_SIZE[:GAMMA]] (a third of --epochs, 0.1), multistep:M1,M2,...[:GAMMA] or cosine (stepped "
     "per epoch); "
     "warmup-cosine (nanoGPT's, per optimizer step: --warmup-steps, --lr-decay-steps, --min-lr)")
    ("warmup-steps", po::value(&o.warmup_steps)->default_value(d.warmup_steps),
     "warmup-cosine: steps of linear warm-up (nanoGPT's warmup_iters)")
    ("lr-decay-steps", po::value(&o.lr_decay_steps)->default_value(d.lr_decay_steps),
     "warmup-cosine: the step where the cosine reaches --min-lr (nanoGPT's lr_decay_iters; 0: --max-steps)")
    ("min-lr", po::value(&o.min_lr)->default_value(d.min_lr, "lr/10"), "warmup-cosine: the floor")
    ("warmup-epochs", po::value(&o.warmup_epochs)->default_value(d.warmup_epochs, num(d.warmup_epochs)),
     "linear warm-up length in epochs (per optimizer step)")
    ("label-smoothing", po::value(&o.label_smoothing)->default_value(d.label_smoothing, num(d.label_smoothing)),
     "cross-entropy label smoothing in [0, 1]")
    ("heatmap-radius", po::value(&o.heatmap_radius)->default_value(d.heatmap_radius),
     "keypoint data: radius r in voxels of each landmark's target Gaussian (sigma = (2r+1)/6); "
     "heatmap3d's own defaults: --data synthetic3d --lr 2 --weight-decay 0 --batch-size 8 --epochs 5 "
     "--heatmap-radius 6");
  // clang-format on
}

void describe_devices(po::options_description& desc, Cli& cli, const train::RunConfig& d) {
  train::RunConfig& o = cli.run;
  // clang-format off
  desc.add_options()
    ("seed", po::value(&cli.seed)->default_value(std::to_string(d.seed)), "seed for initialization and shuffling (0..2^64-1)")
    ("devices", po::value(&o.devices)->default_value(d.devices),
     "auto (every GPU, else cpu:N, one replica per core), cpu, cpu:N (N CPU workers), all, cuda:N, or a list like 0,1,3 or "
     "cuda:0,cuda:1 (a GPU may repeat: 0,0); the first is the primary")
    ("strategy", po::value(&o.strategy)->default_value(d.strategy),
     "dp: one process over every device (DataParallel); ddp: one process per device or group of devices "
     "(DistributedDataParallel; hybrid with --nproc-per-node)")
    ("nproc-per-node", po::value(&o.nproc_per_node),
     "ddp: processes on this machine (default: one per listed device); the devices are split evenly")
    ("nnodes", po::value(&o.nnodes)->default_value(d.nnodes), "ddp: machines taking part")
    ("node-rank", po::value(&o.node_rank)->default_value(d.node_rank), "ddp: this machine's index, 0..nnodes-1")
    ("rdzv", po::value(&o.rdzv),
     "ddp: where ranks meet: file:DIR or redis:HOST:PORT (default: a fresh directory on this machine)")
    ("run-id", po::value(&o.run_id), "ddp: the run's key prefix in the rendezvous (several machines: the same on each)")
    ("rdzv-password-file", po::value(&o.rdzv_password_file),
     "ddp: a file whose first line is the Redis rendezvous's password (or set FANOUT_RDZV_PASSWORD)")
    ("iface", po::value(&o.iface),
     "ddp: the network interface whose address the ranks listen on and give their peers, e.g. eth0 (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME; "
     "default: the one that reaches the Redis server)")
    ("ddp-backend", po::value(&o.ddp_backend)->default_value(d.ddp_backend),
     "ddp: auto (NCCL for GPUs of their own, else Gloo), gloo or nccl")
    ("timeout", po::value(&o.timeout)->default_value(d.timeout, num(d.timeout)),
     "ddp: seconds a rendezvous or a collective may wait before every rank ends with an error")
    ("log-dir", po::value(&o.log_dir), "ddp: also write each rank's output to DIR/rank-N.log")
    ("max-restarts", po::value(&o.max_restarts)->default_value(d.max_restarts),
     "ddp: when a worker fails, stop the others and start them again from --save-dir's newest checkpoint, "
     "up to N times")
    ("no-broadcast-buffers", po::bool_switch(&o.no_broadcast_buffers),
     "ddp: each rank keeps its own BatchNorm running statistics (default: rank 0's, before every forward)")
    ("output-device", po::value(&o.output_device), "where outputs are gathered and the loss computed (default: the primary)")
    ("gather-outputs", po::bool_switch(&o.gather_outputs),
     "dp: gather every output on the output device and compute the loss there, as torch.nn.DataParallel "
     "(default: each replica computes its rows' loss and only the sums reach the primary)")
    ("sync-bn", po::bool_switch(&o.sync_bn), "synchronize BatchNorm statistics across replicas and processes")
    ("dp-comm", po::value(&o.dp_comm)->default_value(d.dp_comm), "gradient reduction: auto; GPUs nccl or p2p; CPU devices cpu")
    ("order-by-free-memory", po::bool_switch(&o.order_by_free_memory),
     "make the listed GPU with the most free memory the primary, and print the order");
  // clang-format on
}

void describe_run(po::options_description& desc, Cli& cli, const train::RunConfig& d) {
  train::RunConfig& o = cli.run;
  // clang-format off
  desc.add_options()
    ("list-devices", po::bool_switch(&cli.list_devices), "print every visible GPU and the peer-access matrix, and exit")
    ("workers", po::value(&o.workers)->default_value(d.workers), "data-loader threads (0: load on the training thread)")
    ("prefetch", po::value(&o.prefetch)->default_value(d.prefetch), "batches in flight per loader thread")
    ("pin-memory", po::value(&o.pin_memory)->default_value(d.pin_memory)->implicit_value("on"),
     "page-locked batch buffers: auto (on with GPUs), on, off")
    ("augment", po::value(&o.augment)->default_value(d.augment),
     "training augmentation: none, or a comma list of crop[:PADDING] (random crop, default padding 4) and flip; "
     "image files (imagefolder:DIR): random-resized-crop:S[:SMIN:SMAX] or [resize:R,]center-crop:S, and flip "
     "(evaluation: resize and center crop, 256 and 224 for a 224 crop); jpeg-draft: JPEGs decode at 1/2 to 1/8 "
     "where the resize leaves 3 pixels per output pixel (faster; not torchvision's pixels)")
    ("skip-bad-samples", po::bool_switch(&o.skip_bad_samples),
     "image files: a file that cannot be read or decoded is reported once and replaced by the next good one, "
     "counted in the metrics (skipped_samples), instead of ending the run")
    ("normalize", po::value(&o.normalize)->default_value(d.normalize),
     "image files: imagenet, none (values in [0, 1]), M,S or M1,M2,M3,S1,S2,S3 (per-channel mean and std)")
    ("drop-last", po::bool_switch(&o.drop_last), "drop the last training batch when it is smaller")
    ("save-dir", po::value(&o.save_dir), "write epoch-NNNN.safetensors checkpoints (and best.safetensors) here")
    ("save-every", po::value(&o.save_every)->default_value(d.save_every), "checkpoint every N epochs (and after the last)")
    ("save-every-steps", po::value(&o.save_every_steps)->default_value(d.save_every_steps),
     "also checkpoint inside epochs every N optimizer steps (0: never); --resume continues from the exact step")
    ("keep-last", po::value(&o.keep_last)->default_value(d.keep_last), "keep the newest K epoch checkpoints")
    ("overwrite", po::bool_switch(&o.overwrite),
     "start a fresh run in a --save-dir that holds another run's checkpoints, removing them; with --resume FILE, "
     "remove the checkpoints there past FILE")
    ("resume", po::value(&o.resume),
     "continue a run from a checkpoint file, or from the newest one in a directory (--epochs counts the whole run)")
    ("allow-batch-change", po::bool_switch(&o.allow_batch_change),
     "with --resume from inside an epoch: accept another --batch-size; the rest of that epoch is re-batched "
     "from the sample it stopped at")
    ("stop-after", po::value(&o.stop_after)->default_value(d.stop_after),
     "stop once epoch N of the run is done (0: run them all); --resume continues it")
    ("init-from", po::value(&o.init_from), "initialize the model's weights from a safetensors file (optimizer state not loaded)")
    ("non-strict", po::bool_switch(&o.non_strict), "with --init-from: load the tensors that fit and list the rest")
    ("metrics", po::value(&o.metrics), "append one JSON object per epoch to this file")
    ("progress", po::value(&o.progress)->default_value(d.progress), "auto (a bar on a terminal), bar, lines or off")
    ("timing-warmup", po::value(&o.timing_warmup)->default_value(d.timing_warmup),
     "steps at the start of each epoch left out of its img/s and steady_epoch_seconds (benchmarks)")
    ("precision", po::value(&o.precision)->default_value(d.precision),
     "32, bf16-mixed (autocast to bfloat16) or 16-mixed (float16 with loss scaling), Lightning's names (32-true, bf16 "
     "and 16 too); float32 master weights and "
     "optimizer state in every mode. CPU devices store and round as GPUs do; their products run in bfloat16 "
     "where the CPU has bfloat16 instructions (AVX-512 BF16, AMX), in float32 elsewhere and for 16-mixed")
    ("shard-optimizer", po::bool_switch(&o.shard_optimizer),
     "ZeRO-1: every replica (of every process under DDP) holds the optimizer state of one range of the "
     "parameters, gets that range's reduced gradient, updates it on its own thread and passes it on")
    ("shard-grads", po::bool_switch(&o.shard_grads),
     "ZeRO-2 (implies --shard-optimizer; CPU devices): every replica also keeps only its range's reduced "
     "gradient; the rest lives in pooled blocks until its bucket is reduced")
    ("checkpoint-activations", po::bool_switch(&o.checkpoint_activations),
     "activation checkpointing: each block of the model (resnet18's BasicBlocks, heatmap3d's stages, GPT's "
     "Blocks) keeps only its input and output and runs its forward again in backward; results bit for bit "
     "those without it")
    ("grad-reduce-dtype", po::value(&o.grad_reduce_dtype)->default_value(d.grad_reduce_dtype),
     "fp32, or bf16: gradient buckets rounded to bfloat16 before and after each reduction (DDP's "
     "bf16_compress_hook)")
    ("cuda-graphs", po::value(&o.cuda_graphs)->default_value(d.cuda_graphs),
     "auto: on GPUs, training steps of a model without dropout are captured into CUDA graphs and replayed "
     "(the same results, fewer launches); off: plain launches; check: on any device, run the steps that would "
     "be captured under the capture check (an error names what would break a capture)")
    ("allow-tf32", po::bool_switch(&o.allow_tf32), "TF32 tensor cores for matrix products and convolutions on CUDA")
    ("cudnn-benchmark", po::bool_switch(&o.cudnn_benchmark), "search for the fastest cuDNN algorithms")
    ("deterministic", po::bool_switch(&o.deterministic), "only deterministic cuDNN algorithms")
    ("split-invariant", po::bool_switch(&o.split_invariant),
     "CPU devices: the same parameters whatever the device or process count (weight gradients summed exactly "
     "in float64; no BatchNorm models)")
    ("cpu-threads", po::value(&o.cpu_threads)->default_value(d.cpu_threads),
     "CPU devices: threads for each device's kernels (0: its share of the cores, cores / (devices x processes "
     "on this machine); 1 with --split-invariant)")
    ("config", po::value<std::string>(), "read options from this file (key = value lines; the command line wins)");
  // clang-format on
}

// Reads a --config file into vm; what the command line gave (stored first) wins.
void read_config_file(const std::string& path, const po::options_description& desc, po::variables_map& vm) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  FANOUT_USER_CHECK(fs::exists(st)) << "config file " << path << " does not exist";
  FANOUT_USER_CHECK(!fs::is_directory(st)) << "config file " << path << " is a directory";
  FANOUT_USER_CHECK(fs::is_regular_file(st)) << "config file " << path << " is not a regular file";
  const auto size = fs::file_size(path, ec);
  FANOUT_USER_CHECK(!ec && size <= kMaxConfigBytes)
      << "config file " << path << " is " << size << " bytes; a config file holds at most " << kMaxConfigBytes;
  std::ifstream f(path, std::ios::binary);
  FANOUT_USER_CHECK(f.good()) << "cannot open config file " << path << ": " << std::strerror(errno);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  FANOUT_USER_CHECK(!f.bad()) << "cannot read config file " << path << ": " << std::strerror(errno);
  // Not text (a binary given by mistake): say where, without echoing its bytes.
  int64_t line = 1;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    FANOUT_USER_CHECK((c >= 0x20 && c != 0x7f) || c == '\t' || c == '\n' || c == '\r')
        << "config file " << path << " is not text: line " << line << " holds the control byte 0x" << std::hex
        << std::setw(2) << std::setfill('0') << static_cast<int>(c);
    line += c == '\n';
  }
  // Boost's syntax starts a comment at any '#': one inside a value would cut it silently.
  std::istringstream lines(text);
  line = 0;
  for (std::string l; std::getline(lines, l);) {
    ++line;
    const size_t eq = l.find('='), hash = l.find('#');
    if (eq == std::string::npos || hash == std::string::npos || hash < eq) continue;
    const size_t start = l.find_first_not_of(" \t", eq + 1);
    FANOUT_USER_CHECK(start == hash || l[hash - 1] == ' ' || l[hash - 1] == '\t')
        << "config file " << path << " line " << line << ": '#' starts a comment, so the value would be cut to '"
        << l.substr(start, l.find_last_not_of(" \t", hash - 1) + 1 - start)
        << "' (a name with '#' in it can only be given on the command line)";
  }
  std::istringstream in(text);
  try {
    const po::parsed_options from_file = po::parse_config_file(in, desc);
    for (const auto& opt : from_file.options) {
      FANOUT_USER_CHECK(opt.string_key != "config")
          << "config file " << path << " names another config file (config = ...): put its options in one file";
      FANOUT_USER_CHECK(opt.string_key != "help" && opt.string_key != "list-devices")
          << "config file " << path << " sets " << opt.string_key << ", which only the command line can give";
    }
    po::store(from_file, vm);
  } catch (const po::error& e) {  // its own errors name the option, not the file
    FANOUT_FAIL() << "config file " << path << ": " << e.what();
  }
}

// heatmap3d's recipe for the options left at their (classification) defaults.
void apply_heatmap_recipe(const po::variables_map& vm, train::RunConfig& o) {
  auto unset = [&](const char* name) { return !vm.count(name) || vm[name].defaulted(); };
  if (unset("data")) o.data = "synthetic3d";
  if (unset("lr")) o.lr = kHeatmapRecipe.lr;
  if (unset("weight-decay")) o.weight_decay = kHeatmapRecipe.weight_decay;
  if (unset("batch-size")) o.batch_size = kHeatmapRecipe.batch_size;
  if (unset("epochs")) o.epochs = kHeatmapRecipe.epochs;
  if (unset("heatmap-radius")) o.heatmap_radius = kHeatmapRecipe.heatmap_radius;
}

// Where checkpoints go: --save-dir, else the directory --resume names
// (resuming from a directory keeps saving there).
std::string save_dir_of(const train::RunConfig& c) {
  if (!c.save_dir.empty()) return c.save_dir;
  std::error_code ec;
  if (!c.resume.empty() && std::filesystem::is_directory(c.resume, ec)) return c.resume;
  return "";
}

// Runs `take` (locking the save directory); a failure on the directory
// --resume named (no --save-dir) says how to save elsewhere.
template <class Take>
auto with_save_dir_hint(const train::RunConfig& c, Take&& take) {
  try {
    return take();
  } catch (const Error& e) {
    if (!c.save_dir.empty()) throw;
    throw Error(std::string(e.what()) + " (--resume DIR keeps saving into DIR; give --save-dir to save elsewhere)");
  }
}

Cli parse(int argc, char** argv) {
  Cli cli;
  train::RunConfig& o = cli.run;
  const train::RunConfig d;  // the defaults, stated once in RunConfig
  po::options_description desc(
      "dp-train: data-parallel training on every device of this machine, and past it\n\n"
      "Usage: dp-train [options]\n\nOptions");
  describe_training(desc, cli, d);
  describe_devices(desc, cli, d);
  describe_run(desc, cli, d);
  po::variables_map vm;
  po::store(apps::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc
              << "\nExamples:\n  dp-train --model cnn --epochs 10 --devices cpu --metrics run.jsonl\n"
                 "  dp-train --model lenet --devices cpu:2 --strategy ddp\n";
    cli.help = true;
    return cli;
  }
  if (vm.count("config")) read_config_file(vm["config"].as<std::string>(), desc, vm);
  po::notify(vm);
  for (const auto& [name, v] : vm)
    if (!v.defaulted()) cli.given.insert(name);
  o.seed = apps::parse_seed(cli.seed);
  std::tie(o.beta1, o.beta2) = apps::parse_betas(cli.betas);
  // --min-lr's default (lr / 10) is kept as -1: a negative value given is an error, not that default.
  FANOUT_USER_CHECK(vm["min-lr"].defaulted() || o.min_lr >= 0)
      << "--min-lr must be in [0, --lr], got " << o.min_lr;
  for (const char* dir : {"save-dir", "resume", "init-from", "metrics", "log-dir"})
    FANOUT_USER_CHECK(!vm.count(dir) || !vm[dir].as<std::string>().empty()) << "--" << dir << " needs a path, got ''";
  if (models::dense_output(o.model)) apply_heatmap_recipe(vm, o);
  // --max-steps alone: at most this many epochs (each has at least one step);
  // run() sets the number it takes once the data is open.
  cli.epochs_from_steps = o.max_steps > 0 && (!vm.count("epochs") || vm["epochs"].defaulted());
  // Until the data gives the real count: enough that --warmup-epochs is judged against it then.
  if (cli.epochs_from_steps)
    o.epochs = static_cast<int>(std::min<double>(
        std::max<double>(static_cast<double>(o.max_steps), std::isfinite(o.warmup_epochs) ? std::ceil(o.warmup_epochs) : 0),
        1 << 30));
  FANOUT_USER_CHECK(!vm.count("nproc-per-node") || o.nproc_per_node >= 1)
      << "--nproc-per-node must be at least 1, got " << o.nproc_per_node;
  // Options that would otherwise be ignored without a word.
  for (const char* ddp_only : {"nproc-per-node", "log-dir", "iface", "rdzv-password-file"})
    FANOUT_USER_CHECK(!vm.count(ddp_only) || o.distributed()) << "--" << ddp_only << " applies to --strategy ddp";
  FANOUT_USER_CHECK(o.max_restarts >= 0) << "--max-restarts must be at least 0, got " << o.max_restarts;
  FANOUT_USER_CHECK(o.max_restarts == 0 || o.distributed())
      << "--max-restarts applies to --strategy ddp (it restarts the worker processes)";
  FANOUT_USER_CHECK(o.max_restarts == 0 || !save_dir_of(o).empty())
      << "--max-restarts needs --save-dir: a restart continues from its newest checkpoint";
  o.validate();
  return cli;
}

// --- devices -------------------------------------------------------------

int list_devices() {
  const auto info = cuda_device_info();
  if (info.empty()) {
    std::printf("no CUDA device visible%s; CPU devices: cpu, cpu:N\n",
                cuda_available_in_build() ? "" : " (this build has no CUDA backend)");
    return 0;
  }
  for (auto& d : info)
    std::printf("cuda:%d  %s  %.1f GiB total  %.1f GiB free  compute capability %d.%d\n", d.index, d.name.c_str(),
                d.total_bytes / 1073741824.0, d.free_bytes / 1073741824.0, d.major, d.minor);
  std::printf("peer access (row reads column):\n      ");
  for (auto& b : info) std::printf(" %4d", b.index);
  std::printf("\n");
  for (auto& a : info) {
    std::printf("  %4d", a.index);
    for (auto& b : info) std::printf(" %4s", cuda_can_access_peer(a.index, b.index) ? "yes" : "no");
    std::printf("\n");
  }
  return 0;
}

std::vector<Device> order_by_free_memory(std::vector<Device> devices, bool print) {
  const auto info = cuda_device_info();
  auto free_of = [&](const Device& d) { return info.at(d.index).free_bytes; };
  std::stable_sort(devices.begin(), devices.end(),
                   [&](const Device& a, const Device& b) { return free_of(a) > free_of(b); });
  if (print) {
    std::printf("device order by free memory:");
    for (auto& d : devices) std::printf(" %s (%.1f GiB free)", d.str().c_str(), free_of(d) / 1073741824.0);
    std::printf("\n");
  }
  return devices;
}

// The batch of one process on this machine: --devices auto shares it out.
int64_t local_batch(const train::RunConfig& c) {
  if (!c.distributed()) return c.batch_size;
  const int nproc = c.nproc_per_node > 0 ? c.nproc_per_node : 1;
  return std::max<int64_t>(1, c.batch_size / (static_cast<int64_t>(nproc) * c.nnodes));
}

// Every device listed for this machine (before any split over processes).
std::vector<Device> machine_devices(const train::RunConfig& c) {
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string spec = c.devices;
  if (spec == "auto") {
    spec = auto_devices(local_batch(c), kernel_thread_budget(), cuda_device_count()).spec;
    static bool warned = false;
    if (!cuda_available_in_build() && !warned && std::filesystem::exists("/dev/nvidiactl")) {
      std::fprintf(stderr,
                   "dp-train: warning: this machine has an NVIDIA GPU but this build has no CUDA backend, so it "
                   "trains on the CPU (rebuild with nvcc on PATH; apps/setup.sh looks in /usr/local/cuda)\n");
      warned = true;
    }
  }
  FANOUT_USER_CHECK(!(cvd && std::string(cvd).empty() && spec.rfind("cpu", 0) != 0))
      << "CUDA_VISIBLE_DEVICES is set but empty, so no GPU is visible (unset it, or use --devices cpu)";
  return parse_devices(spec);
}

std::string names(const std::vector<Device>& devices) {
  std::string s;
  for (auto& d : devices) s += (s.empty() ? "" : ",") + d.str();
  return s;
}

// --- launch (ddp, when no launcher started us) ---------------------------

int launch(const train::RunConfig& c, int argc, char** argv) {
  const auto devices = machine_devices(c);
  const int nproc = c.nproc_per_node > 0 ? c.nproc_per_node : static_cast<int>(devices.size());
  split_devices(devices, nproc, 0);  // refuses a list that cannot be split, before anything starts
  FANOUT_USER_CHECK(c.batch_size % (nproc * c.nnodes) == 0)
      << "--batch-size " << c.batch_size << " cannot be split evenly over " << nproc * c.nnodes << " processes";
  if (!c.rdzv.empty()) {
    try {
      distributed::Rendezvous::parse(c.rdzv);
    } catch (const Error& e) {
      throw Error(std::string("--rdzv: ") + e.what());
    }
  }
  distributed::LaunchOptions lo;
  lo.program = apps::self_path();
  lo.args.assign(argv + 1, argv + argc);
  lo.nproc_per_node = nproc;
  lo.nnodes = c.nnodes;
  lo.node_rank = c.node_rank;
  lo.rendezvous = c.rdzv;
  lo.run_id = c.run_id;
  lo.log_dir = c.log_dir;
  lo.max_restarts = c.max_restarts;
  lo.stall_s = c.timeout;
  if (const double g = apps::test_hooks().stop_grace_s; g > 0) lo.stop_grace_s = g;
  // The save directory is this run's while the launcher lives, restarts included (rank 0's worker saves there).
  std::unique_ptr<train::SaveDirLock> held;
  lo.before_start = [&] {
    std::vector<std::string> env;
    if (const std::string dir = save_dir_of(c); !dir.empty() && c.node_rank == 0) {
      held = with_save_dir_hint(c, [&] { return std::make_unique<train::SaveDirLock>(dir, /*for_workers=*/true); });
      env.push_back(held->workers_env());
    }
    return env;
  };
  lo.progress = [&c] {
    try {
      return train::newest_checkpoint(save_dir_of(c));
    } catch (const Error&) {
      return std::string();  // a directory not made yet
    }
  };
  return distributed::launch(lo);
}

// --- this process's part of the run --------------------------------------

struct Process {
  distributed::WorkerEnv env;      // present under DDP
  int rank = 0, world = 1;
  std::vector<Device> devices;  // this process's
  bool primary() const { return rank == 0; }
};

Process this_process(const train::RunConfig& c) {
  Process p;
  auto all = machine_devices(c);
  if (c.order_by_free_memory && all[0].is_cuda()) all = order_by_free_memory(all, true);
  if (!c.distributed()) {
    p.devices = all;
    return p;
  }
  p.env = distributed::worker_env();
  FANOUT_CHECK(p.env.present) << "a DDP worker without a rank";
  p.rank = p.env.rank;
  p.world = p.env.world_size;
  p.devices = split_devices(all, p.env.local_world_size, p.env.local_rank);
  return p;
}

std::unique_ptr<Engine> make_run_engine(const train::RunConfig& c, Module& model, const Process& p,
                                        const std::vector<Device>& all, const data::DataSplits& data) {
  EngineSpec spec;
  spec.devices = p.devices;
  // Heatmap targets take the squared error; class labels cross-entropy; a language model's next tokens token_cross_entropy.
  spec.loss.criterion = data.train->dense_targets() ? CriterionKind::Mse
                        : data.token_data()         ? CriterionKind::TokenCrossEntropy
                                                    : CriterionKind::CrossEntropy;
  spec.loss.label_smoothing = c.label_smoothing;
  spec.dp.loss_on_replicas = !c.gather_outputs;
  if (!c.output_device.empty()) {
    auto od = parse_devices(c.output_device);
    FANOUT_USER_CHECK(od.size() == 1) << "--output-device takes one device, got '" << c.output_device << "'";
    FANOUT_USER_CHECK(std::find(p.devices.begin(), p.devices.end(), od[0]) != p.devices.end())
        << "--output-device " << od[0].str() << " is not one of this process's devices (" << names(p.devices) << ")";
    spec.dp.output_device = od[0];
  }
  spec.dp.sync_bn = c.sync_bn;
  spec.dp.comm = c.dp_comm;
  spec.dp.seed = c.seed;
  spec.dp.math = c.math();
  spec.dp.grad_reduce_dtype = parse_grad_reduce_dtype(c.grad_reduce_dtype);
  spec.cuda_graphs = parse_cuda_graphs(c.cuda_graphs);
  spec.dp.shard_optimizer = c.shard_optimizer || c.shard_grads;
  spec.dp.shard_grads = c.shard_grads;
  if (c.distributed()) {
    distributed::GroupOptions g;
    g.rank = p.rank;
    g.world_size = p.world;
    g.rendezvous = !p.env.rendezvous.empty() ? p.env.rendezvous : c.rdzv;
    FANOUT_USER_CHECK(!g.rendezvous.empty())
        << "this worker was started by " << p.env.source << ": give the rendezvous in FANOUT_RDZV (or with "
        << "--rdzv): file:DIR or redis:HOST:PORT";
    g.run_id = !p.env.run_id.empty() ? p.env.run_id : c.run_id;
    for (const char* v : {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"})
      if (g.run_id.empty() && std::getenv(v)) g.run_id = std::getenv(v);
    if (g.run_id.empty()) g.run_id = "fanout";
    g.timeout_s = c.timeout;
    g.skip = apps::test_hooks().skip;
    // An outside launcher did not check it: the directory is created here (by every rank) if need be.
    if (p.env.source != "fanout") distributed::probe_rendezvous(distributed::Rendezvous::parse(g.rendezvous), c.timeout);
    spec.group = make_process_group(g, c.ddp_backend, p.devices, gpus_shared_by_processes(all, p.env.local_world_size));
    spec.broadcast_buffers = !c.no_broadcast_buffers;
    spec.local_processes = p.env.local_world_size;
    // Beyond the engine's own (model size, buckets, precision): the run's options every rank must share.
    spec.agree = {{"batch size", c.batch_size},
                  {"accumulate", c.accumulate},
                  {"epochs", c.epochs},
                  {"seed", static_cast<int64_t>(c.seed)},
                  {"optimizer (kind)", static_cast<int64_t>(optim::parse_optimizer(c.optimizer))},
                  {"training samples", data.train->size()},
                  {"--max-steps", c.max_steps},
                  {"--nesterov", c.nesterov},
                  {"--warmup-steps", c.warmup_steps},
                  {"--lr-decay-steps", c.lr_decay_steps},
                  {"--lr-schedule (hash)", static_cast<int64_t>(std::hash<std::string>{}(c.lr_schedule) >> 1)},
                  {"--augment (hash)", static_cast<int64_t>(std::hash<std::string>{}(c.augment) >> 1)},
                  {"--drop-last", c.drop_last},
                  {"--stop-after", c.stop_after}};
    // The optimizer's and schedule's numbers: every rank steps its own optimizer on the same gradients.
    for (auto [name, v] : {std::pair{"--lr", double{c.lr}}, {"--momentum", double{c.momentum}},
                           {"--weight-decay", double{c.weight_decay}}, {"--betas (beta1)", c.beta1}, {"--betas (beta2)", c.beta2},
                           {"--eps", c.eps}, {"--clip-grad-norm", c.clip_grad_norm},
                           {"--clip-grad-value", double{c.clip_grad_value}}, {"--min-lr", double{c.min_lr}},
                           {"--warmup-epochs", double{c.warmup_epochs}}, {"--label-smoothing", double{c.label_smoothing}}})
      spec.agree.push_back(distributed::agreed(name, v));
    // What decides the collectives around evaluations and checkpoints (a rank without them would wait for --timeout).
    for (auto [name, v] : {std::pair{"--save-every", int64_t{c.save_every}}, {"--save-every-steps", c.save_every_steps},
                           {"--eval-every", c.eval_every}, {"--eval-steps", c.eval_steps}})
      spec.agree.push_back({name, v});
    spec.agree.push_back(distributed::given("save directory (--save-dir, or --resume DIR)", !save_dir_of(c).empty()));
    spec.agree.push_back(distributed::given("--resume", !c.resume.empty()));
  }
  return make_engine(model, std::move(spec));
}

// One warning line for each option that has no effect on this run.
void warn_inapplicable(const train::RunConfig& c, const std::set<std::string>& given, const Process& p,
                       const std::vector<Device>& all) {
  const auto was = [&](const char* flag) { return given.count(flag + 2) > 0; };  // flag: "--NAME"
  auto warn = [](const std::string& s) { std::fprintf(stderr, "dp-train: warning: %s\n", s.c_str()); };
  if (all[0].is_cpu())
    for (auto [on, flag] : {std::pair{c.allow_tf32, "--allow-tf32"}, std::pair{c.cudnn_benchmark, "--cudnn-benchmark"}})
      if (on) warn(std::string(flag) + " has no effect on CPU devices");
  if (all[0].is_cpu() && c.deterministic)
    warn("--deterministic has no effect on CPU devices: their runs repeat bit for bit at the same devices and "
         "threads");
  if (all[0].is_cuda() && c.cpu_threads > 0) warn("--cpu-threads has no effect on CUDA devices");
  if (parse_grad_reduce_dtype(c.grad_reduce_dtype) != DType::F32 && p.devices.size() == 1 && p.world == 1)
    warn("--grad-reduce-dtype " + c.grad_reduce_dtype + " has no effect with one device (nothing is reduced)");
  if (!c.output_device.empty() && !c.gather_outputs)
    warn("--output-device has no effect without --gather-outputs (the loss runs on each replica)");
  if (c.eval_steps > 0 && c.eval_every == 0) warn("--eval-steps has no effect without --eval-every");
  if (c.gather_outputs && p.devices.size() == 1)
    warn("--gather-outputs has no effect with one device per process");
  if (c.lr_schedule != "warmup-cosine")
    for (const char* flag : {"--min-lr", "--warmup-steps", "--lr-decay-steps"})
      if (was(flag)) warn(std::string(flag) + " has no effect without --lr-schedule warmup-cosine");
  if (c.optimizer != "sgd" && was("--momentum"))
    warn("--momentum has no effect on " + c.optimizer + " (SGD's; Adam's is --betas)");
  if (c.optimizer == "sgd" && was("--betas"))
    warn("--betas has no effect on sgd (Adam's and AdamW's; SGD's is --momentum)");
  if (c.optimizer == "sgd" && was("--eps")) warn("--eps has no effect on sgd (Adam's and AdamW's)");
  if (c.no_decay_norm_bias && c.weight_decay == 0)
    warn("--no-decay-norm-bias has no effect with --weight-decay 0 (nothing decays)");
  if ((c.shard_optimizer || c.shard_grads) && p.devices.size() == 1 && p.world == 1)
    warn(std::string(c.shard_grads ? "--shard-grads" : "--shard-optimizer") +
         " has no effect with one device (nothing to shard)");
  if (c.workers == 0 && was("--prefetch"))
    warn("--prefetch has no effect with --workers 0 (batches are built on the training thread)");
  if (c.resume.empty() && c.allow_batch_change) warn("--allow-batch-change has no effect without --resume");
  if (c.checkpoint_activations && models::dense_output(c.model))
    warn("--checkpoint-activations saves no memory on " + c.model + ": a stage's output, which its checkpointed "
         "block keeps, is most of what the stage holds, and the shared slots add the largest stage again "
         "(on synthetic3d heatmap3d's activations 18% larger, heatmap3d:group's 14%); the results are the same "
         "bits");
  if (save_dir_of(c).empty())
    for (const char* flag : {"--save-every", "--keep-last", "--overwrite"})
      if (was(flag)) warn(std::string(flag) + " has no effect without --save-dir");
  if (!c.distributed())
    for (const char* flag : {"--timeout", "--run-id", "--no-broadcast-buffers", "--ddp-backend"})
      if (was(flag)) warn(std::string(flag) + " has no effect without --strategy ddp");
}

// A GPT whose vocabulary (gpt2's 50304) dwarfs the data's (256 bytes, a text's characters): rows of the
// embedding and the head that no token reaches. nanoGPT takes the data's when it has one (meta.pkl).
void warn_unused_vocabulary(const train::RunConfig& c, const data::DataSplits& data) {
  if (!models::is_gpt(c.model) || !data.token_data() || c.model.find("vocab_size=") != std::string::npos) return;
  const models::GPTConfig g = models::parse_gpt_config(models::gpt_spec(c.model), data.classes);
  if (g.vocab_size < 4 * data.classes) return;
  std::fprintf(stderr, "dp-train: warning: the model's vocabulary of %lld tokens is %lldx the data's %lld: "
               "%lld x %lld weights of the tied embedding and head stand for no token of the data (add "
               "vocab_size=%lld to --model)\n",
               static_cast<long long>(g.vocab_size), static_cast<long long>(g.vocab_size / data.classes),
               static_cast<long long>(data.classes), static_cast<long long>(g.vocab_size - data.classes),
               static_cast<long long>(g.n_embd), static_cast<long long>(data.classes));
}

// What a model trained here expects of its inputs, for whoever deploys it: the per-channel mean and
// std the data was normalized by (image sets and volumes: the training split's), or --normalize's for
// image files; nothing else records them.
void record_input_normalization(const train::RunConfig& c, const data::DataSplits& data, nlohmann::json& config) {
  if (!c.data.starts_with("imagefolder:") && !c.data.starts_with("wds:")) config.erase("normalize");
  const auto* images = dynamic_cast<const data::ImageDataset*>(data.train.get());
  if (!images || images->mean.empty()) return;
  config["input_mean"] = images->mean;
  config["input_std"] = images->std;
}

// --sync-bn where no statistics would be shared: one replica in all, or a model without BatchNorm.
void warn_sync_bn_unused(const train::RunConfig& c, Module& model, const Process& p) {
  if (!c.sync_bn) return;
  bool batch_norm = false;
  for (const auto& [name, b] : model.named_buffers()) batch_norm = batch_norm || name.ends_with("running_mean");
  if (!batch_norm)
    std::fprintf(stderr, "dp-train: warning: --sync-bn has no effect on %s (it has no BatchNorm)\n", c.model.c_str());
  else if (p.devices.size() == 1 && p.world == 1)
    std::fprintf(stderr, "dp-train: warning: --sync-bn has no effect with one device (its batch is the whole batch)\n");
}

// The same for the options of a kind of data or of GPUs.
void warn_inapplicable_data(const train::RunConfig& c, const std::set<std::string>& given,
                            const std::vector<Device>& all) {
  auto warn = [](const std::string& s) { std::fprintf(stderr, "dp-train: warning: %s\n", s.c_str()); };
  const auto is = [&](const char* prefix) { return c.data.starts_with(prefix); };
  if (!is("imagefolder:") && !is("wds:"))
    for (const char* flag : {"normalize", "skip-bad-samples"})
      if (given.count(flag))
        warn("--" + std::string(flag) + " has no effect without image files (imagefolder:DIR, wds:DIR)");
  if (!is("keypoints3d:") && !is("synthetic3d") && !models::dense_output(c.model) && given.count("heatmap-radius"))
    warn("--heatmap-radius has no effect without keypoint volumes (keypoints3d:DIR, synthetic3d)");
  if (all[0].is_cpu() && c.pin_memory == "on")
    warn("--pin-memory on has no effect on CPU devices (page-locked buffers speed copies to GPUs)");
  if (all[0].is_cpu() && c.order_by_free_memory) warn("--order-by-free-memory has no effect on CPU devices");
}

// The epochs --max-steps alone takes (the cosine schedule spans them, the log
// counts them): from the start, or, resuming, from where the checkpoint
// stopped (a run that ended on --max-steps marked its partial epoch done; a
// mid-epoch checkpoint's steps in its epoch count toward that epoch).
int epochs_for_max_steps(const train::RunConfig& c, const Process& p, const data::Dataset& train) {
  const int64_t per_epoch = train::optimizer_steps_per_epoch(c.trainer_config(false), p.world, p.rank, train);
  if (per_epoch <= 0) return c.epochs;
  int64_t epochs = (c.max_steps + per_epoch - 1) / per_epoch;
  if (!c.resume.empty()) {
    const std::string path = train::resolve_resume_path(c.resume);
    io::TensorFile f;
    try {
      f = io::load_safetensors(path);
    } catch (const Error&) {
      // An unreadable checkpoint is reported when it is loaded (restore), with the way back to an earlier one.
    }
    const auto meta = [&](const char* key) {
      int64_t v = 0;
      const auto it = f.metadata.find(key);
      if (it != f.metadata.end()) std::from_chars(it->second.data(), it->second.data() + it->second.size(), v);
      return std::max<int64_t>(v, 0);  // a malformed checkpoint is reported when it is loaded
    };
    const int64_t left = std::max<int64_t>(0, c.max_steps - meta("step"));
    const int64_t in_epoch = (meta("batch") + c.accumulate - 1) / c.accumulate;  // steps done in the open epoch
    epochs = std::max(epochs, meta("epoch") + (left + in_epoch + per_epoch - 1) / per_epoch);
  }
  return static_cast<int>(std::clamp<int64_t>(epochs, 1, 1 << 30));
}

// What needs the training data: the epochs --max-steps alone takes, and
// whether --timing-warmup leaves an epoch anything to time.
void settle_with_data(train::RunConfig& c, const Process& p, bool epochs_from_steps, const data::Dataset& train) {
  if (epochs_from_steps) {
    c.epochs = epochs_for_max_steps(c, p, train);
    FANOUT_USER_CHECK(c.warmup_epochs <= c.epochs)
        << "--warmup-epochs " << c.warmup_epochs << " is longer than the " << c.epochs << " epoch"
        << (c.epochs == 1 ? "" : "s") << " --max-steps " << c.max_steps
        << " takes: warm up for fewer epochs, or give --epochs";
    c.validate();
  }
  if (c.timing_warmup > 0 && p.primary()) {
    train::TrainerConfig batches = c.trainer_config(false);
    batches.accumulate = 1;
    const int64_t n = train::optimizer_steps_per_epoch(batches, p.world, p.rank, train);
    if (c.timing_warmup >= n)
      std::fprintf(stderr, "dp-train: warning: --timing-warmup %d is not below an epoch's %lld batches: each epoch's "
                   "time counts its last batch only\n", c.timing_warmup, static_cast<long long>(n));
  }
}

// --- restore -------------------------------------------------------------

// The launch this worker belongs to (FANOUT_RUN_ID less its "/restart-N"),
// which its checkpoints record; empty outside a fanout launcher.
std::string launch_id() {
  const char* id = std::getenv("FANOUT_RUN_ID");
  if (!id || !distributed::worker_env().present) return "";
  const std::string s = id;
  return s.substr(0, s.find("/restart-"));
}

// A restarted worker (the launcher's restart n > 0) continues from the save
// directory's newest checkpoint; with none there yet it starts as the first
// start did, replacing what that one left (checkpoints, metrics lines). With
// --overwrite the directory's checkpoints are the run being replaced until
// this launch saves one of its own: until then a restart starts as the first.
train::RunConfig restarted(train::RunConfig c) {
  const char* n = std::getenv("FANOUT_RESTART_COUNT");
  if (!n || !*n || std::string(n) == "0") return c;
  const std::string dir = save_dir_of(c);
  FANOUT_USER_CHECK(!dir.empty()) << "FANOUT_RESTART_COUNT=" << n << " but no --save-dir to continue from";
  const std::string newest = train::newest_checkpoint(dir);
  bool ours = !newest.empty();
  if (ours && c.overwrite) {
    std::map<std::string, std::string> meta;
    try {
      meta = io::read_safetensors_metadata(newest);
    } catch (const Error&) {
    }
    ours = meta.count("run_id") && meta["run_id"] == launch_id();
  }
  if (!ours && c.overwrite && !c.resume.empty()) return c;  // resumes what the first start resumed
  if (!ours) {
    c.overwrite = true;
    // The failed start's epoch lines (--save-every above 1) are trained again.
    if (!c.metrics.empty() && distributed::worker_env().rank == 0) train::drop_metrics_after(c.metrics, 0, 0);
  } else {
    c.resume = dir;
    c.init_from.clear();
    c.non_strict = false;
  }
  return c;
}

// --init-from a dp-train checkpoint of token data whose vocabulary is not
// this data's: the same ids stand for other text (tensors of one size load).
void warn_other_vocabulary(const std::string& path, const std::map<std::string, std::string>& meta,
                           const nlohmann::json& config) {
  const auto it = meta.find("config");
  if (it == meta.end() || !config.contains("tokens")) return;
  const nlohmann::json was = nlohmann::json::parse(it->second, nullptr, false);
  if (!was.is_object() || !was.contains("tokens") || was["tokens"] == config["tokens"]) return;
  std::fprintf(stderr, "dp-train: warning: %s was trained on another vocabulary than this data's: its token ids stand "
                       "for other text\n", path.c_str());
}

// What a resume found, as rank 0 prints it.
void print_resumed(const train::RunConfig& c, const train::ResumeOutcome& r) {
  const train::CheckpointState& st = r.state;
  if (r.rebatch)
    std::printf("the rest of epoch %d is re-batched: batches of %lld from sample %lld, where batches of %lld "
                "stopped\n",
                st.epoch + 1, static_cast<long long>(r.rebatch->batch_size),
                static_cast<long long>(r.rebatch->from_sample), static_cast<long long>(r.rebatch->was));
  for (const train::OptionChange& o : r.changed)
    if (o.key == "tokens")  // a vocabulary, a tokenizer's tens of thousands of tokens: not printed
      std::fprintf(stderr, "dp-train: warning: the data's vocabulary differs from the checkpoint's: the run will "
                           "not continue exactly\n");
    else
      std::fprintf(stderr, "dp-train: warning: %s was %s in the checkpoint, now %s: the run will not continue "
                           "exactly\n", o.key.c_str(), o.was.dump().c_str(), o.now.dump().c_str());
  std::printf("resumed from %s: %d of %d epochs done%s, %lld steps\n", r.path.c_str(), st.epoch, c.epochs,
              st.batch > 0 ? (" and " + std::to_string(st.batch) + " batches of the next").c_str() : "",
              static_cast<long long>(st.step));
  if (r.complete) std::printf("nothing left to train (raise --epochs to train further)\n");
  else if (save_dir_of(c).empty())
    std::fprintf(stderr, "dp-train: warning: --resume %s continues the run without saving it: give --save-dir DIR to "
                 "write its checkpoints\n", c.resume.c_str());
}

// Every process resumed from the same place: a machine given a stale copy
// of the save directory would train another run beside the others.
void check_same_resume(Engine& engine, const train::CheckpointState& st) {
  const int world = engine.world_size(), rank = engine.rank();
  if (world == 1) return;
  std::vector<int64_t> v(3 * static_cast<size_t>(world), 0);
  const size_t mine = 3 * static_cast<size_t>(rank);
  v[mine] = st.epoch, v[mine + 1] = st.batch, v[mine + 2] = st.step;
  engine.all_reduce_stats(v, "the resume check");
  const auto where = [&](int r) {
    const size_t i = 3 * static_cast<size_t>(r);
    const auto count = [](int64_t n, const char* one, const char* many) {
      return std::to_string(n) + " " + (n == 1 ? one : many);
    };
    return "after " + count(v[i], "epoch", "epochs") + " and " + count(v[i + 1], "batch", "batches") + " (step " +
           std::to_string(v[i + 2]) + ")";
  };
  for (int r = 1; r < world; ++r)
    FANOUT_USER_CHECK(std::equal(v.begin() + 3 * r, v.begin() + 3 * r + 3, v.begin()))
        << "rank " << r << " resumed " << where(r) << " where rank 0 resumed " << where(0)
        << ": every rank must resume the same checkpoint (give every machine a copy of rank 0's save directory)";
}

// Loads --resume (train::resume_run; every rank reads the file) or
// --init-from; returns the checkpoint state to continue from, or nothing
// when the run is complete.
std::optional<train::CheckpointState> restore(const train::RunConfig& c, Engine& engine, optim::Optimizer& opt,
                                              const Process& p, const nlohmann::json& config) {
  train::CheckpointState ckpt;
  if (!c.resume.empty()) {
    train::ResumeOutcome resumed;
    try {
      resumed = train::resume_run(c, engine, opt, config);
    } catch (const train::NotATrainingCheckpoint& e) {
      throw Error(e.path() + " is not a fanout training checkpoint (a model's weights alone, or not fanout's): " +
                  "--init-from " + e.path() + " starts a run from its weights");
    } catch (const Error& e) {
      std::error_code ec;
      if (!std::filesystem::is_directory(c.resume, ec)) throw;
      // --resume DIR takes the newest: name the way back to an earlier one when that file cannot be read.
      const std::string newest = train::resolve_resume_path(c.resume), what = e.what();
      const bool damaged = what.rfind(newest + ": ", 0) == 0 ||  // the file's own structure (safetensors)
                           (what.rfind("checkpoint " + newest + ": ", 0) == 0 &&
                            (what.find("non-finite") != std::string::npos || what.find("metadata") != std::string::npos));
      if (!damaged) throw;
      throw Error(what + " (to continue from an earlier checkpoint: --resume " + c.resume +
                  "/epoch-NNNN.safetensors --save-dir " + c.resume + " --overwrite, which removes the ones after it)");
    }
    check_same_resume(engine, resumed.state);
    if (p.primary()) print_resumed(c, resumed);
    if (resumed.complete) return std::nullopt;
    ckpt = std::move(resumed.state);
    if (!c.metrics.empty() && p.primary()) {
      // An epoch's checkpoint carries that epoch's line: a metrics file that lost it (a write cut short) gets it back.
      bool restored = false;
      const int dropped = train::drop_metrics_after(c.metrics, ckpt.epoch, ckpt.step,
                                                    ckpt.batch == 0 ? &ckpt.metrics : nullptr, &restored);
      if (dropped > 0)
        std::printf("removed %d line%s from %s (after epoch %d: trained again; or a write cut short)\n", dropped,
                    dropped == 1 ? "" : "s", c.metrics.c_str(), ckpt.epoch);
      if (restored)
        std::printf("restored epoch %d's line in %s from the checkpoint\n", ckpt.epoch, c.metrics.c_str());
    }
  }
  if (!c.init_from.empty()) {
    std::map<std::string, std::string> meta;
    const io::LoadReport r = train::load_weights(c.init_from, engine.model(), !c.non_strict, &meta);
    if (p.primary()) std::printf("initialized from %s: %s\n", c.init_from.c_str(), r.summary().c_str());
    if (p.primary()) warn_other_vocabulary(c.init_from, meta, config);
  }
  ckpt.config = config;
  return ckpt;
}

// --- train ---------------------------------------------------------------

// The Trainer's settings in this process: rank 0 alone prints, writes
// metrics and saves.
train::TrainerConfig process_trainer_config(const train::RunConfig& c, const Process& p) {
  train::TrainerConfig tc = c.trainer_config(p.devices[0].is_cuda());
  if (!p.primary()) {
    tc.progress = train::Progress::Mode::Off;
    tc.summary_out = nullptr;
    tc.metrics_path.clear();
  } else if (tc.progress == train::Progress::Mode::Auto && std::getenv("FANOUT_STDERR_TTY")) {
    tc.progress = train::Progress::Mode::Bar;  // the launcher's terminal, behind its pipe
  }
  if (!tc.metrics_path.empty()) apps::check_output_file("--metrics", tc.metrics_path);
  return tc;
}

// The last epoch this run trains (--stop-after), checked against the
// checkpoint and the save directory.
int last_epoch(const train::RunConfig& c, const train::CheckpointState& ckpt, const std::string& save_dir) {
  FANOUT_USER_CHECK(c.stop_after == 0 || c.stop_after > ckpt.epoch)
      << "--stop-after " << c.stop_after << " but the checkpoint already has " << ckpt.epoch << " epochs done";
  const int last = c.stop_after > 0 ? std::min(c.epochs, c.stop_after) : c.epochs;
  FANOUT_USER_CHECK(last == c.epochs || !save_dir.empty())
      << "--stop-after " << c.stop_after << " without --save-dir would leave nothing to --resume from";
  FANOUT_USER_CHECK(c.save_every_steps == 0 || !save_dir.empty())
      << "--save-every-steps needs --save-dir (or --resume DIR)";
  return last;
}

// Stops at SIGINT / SIGTERM; and the test hooks (apps/test_hooks.h): every
// step held a while, or one rank that stops making progress (without
// stopping) after some steps, as a deadlocked data worker would.
void set_stop_check(train::Trainer& trainer, const optim::Optimizer& opt, int rank) {
  const apps::TestHooks& hooks = apps::test_hooks();
  trainer.should_stop = [hold = hooks.step_sleep_s, hang = hooks.hang_rank == rank, hang_at = hooks.hang_at_step,
                         &opt] {
    if (hold > 0) std::this_thread::sleep_for(std::chrono::duration<double>(hold));
    while (hang && opt.steps() >= hang_at) std::this_thread::sleep_for(std::chrono::seconds(1));
    return g_stop_signal != 0;
  };
  trainer.should_stop_evaluating = [] { return g_stop_signal != 0; };  // between evaluation batches, no hooks
}

// What train_run's callbacks saved, for the end of a stopped run.
struct Saved {
  std::string stop_path;  // the checkpoint written as the run stopped
  int epoch = -1;         // the last epoch whose end-of-epoch checkpoint was written
};

// A run stopped by a signal: an epoch end's checkpoint that was not due is
// written now, and one line says where the run stopped and what it saved.
int finish_stopped(const train::Trainer& trainer, Engine& engine, optim::Optimizer& opt, const Process& p,
                   const train::CheckpointState& ckpt, const std::string& save_dir, train::CheckpointSaver* saver,
                   Saved saved) {
  const int sig = g_stop_signal;
  const int epoch = trainer.stopped_epoch();
  const int64_t batch = trainer.stopped_at().batch;
  if (!save_dir.empty() && batch == 0 && saved.epoch != epoch) opt.gather_state();  // every rank
  if (!p.primary()) return 128 + (sig != 0 ? sig : SIGTERM);
  if (saver && saved.stop_path.empty()) {  // stopped at an epoch's end
    saved.stop_path = (std::filesystem::path(save_dir) / train::CheckpointSaver::epoch_file(epoch)).string();
    if (saved.epoch != epoch) saver->save_mid_epoch(engine, opt, ckpt);  // its checkpoint was not due: ckpt is that epoch's
  }
  // sig 0: this rank had no signal and stopped because another rank had one (Trainer::stop_agreed).
  const std::string by = sig == SIGINT    ? "by SIGINT"
                         : sig == SIGTERM ? "by SIGTERM"
                         : sig == 0       ? "with the other ranks (another rank had a stop signal)"
                                          : std::string("by ") + strsignal(sig);
  std::printf("stopped %s %s: %s\n", by.c_str(),
              batch > 0 ? ("in epoch " + std::to_string(epoch + 1) + " after batch " + std::to_string(batch)).c_str()
                        : ("after epoch " + std::to_string(epoch)).c_str(),
              saved.stop_path.empty() ? "nothing saved (no --save-dir)"
                                      : ("saved " + saved.stop_path + "; continue with --resume " + save_dir).c_str());
  std::fflush(stdout);
  return 128 + (sig != 0 ? sig : SIGTERM);
}

int train_run(const train::RunConfig& c, Engine& engine, optim::Optimizer& opt, const data::DataSplits& data,
              const Process& p,
              train::CheckpointState ckpt, const std::string& save_dir, train::CheckpointSaver* saver) {
  const int last = last_epoch(c, ckpt, save_dir);
  train::Trainer trainer(process_trainer_config(c, p), engine, opt, *data.train, *data.test);
  if (saver) saver->remove_replaced();  // --overwrite's: every check has passed
  optim::GradScaler* scaler = trainer.grad_scaler();
  // 16-mixed continues with the saved scale; a checkpoint of another precision has none to give.
  if (scaler && !ckpt.grad_scaler.empty()) scaler->load_state(ckpt.grad_scaler);
  trainer.set_steps_skipped_before(ckpt.step - opt.steps());
  auto scaler_state = [scaler] { return scaler ? scaler->state() : nlohmann::json::object(); };
  set_stop_check(trainer, opt, p.rank);
  Saved saved;
  trainer.on_mid_epoch = [&](int epoch, const train::EpochPosition& pos, bool stopping) {
    ckpt.epoch = epoch;
    ckpt.batch = pos.batch;
    ckpt.partial = pos.totals;
    ckpt.step = trainer.steps();
    ckpt.grad_scaler = scaler_state();
    if (!save_dir.empty()) opt.gather_state();  // every rank: state sharded across processes meets on rank 0
    if (!saver) return;
    const std::string path = saver->save_mid_epoch(engine, opt, ckpt);
    if (stopping) saved.stop_path = path;
    std::printf("saved %s\n", path.c_str());
    std::fflush(stdout);
  };
  trainer.on_eval = [&](const train::EvalMetrics& e) {
    ckpt.step = trainer.steps();
    ckpt.metrics = train::eval_json(e);
    ckpt.score = e.best_score();
    if (!saver) return;
    if (const std::string path = saver->save_if_best(engine, ckpt); !path.empty()) {
      std::printf("saved %s\n", path.c_str());
      std::fflush(stdout);
    }
  };
  trainer.on_epoch_end = [&](const train::EpochMetrics& m) {
    ckpt.epoch = m.epoch;
    ckpt.batch = 0;
    ckpt.partial = nlohmann::json::object();
    ckpt.step = trainer.steps();
    ckpt.grad_scaler = scaler_state();
    ckpt.metrics = train::metrics_json(m);
    ckpt.score = m.best_score();
    const bool saving = !save_dir.empty() && (m.epoch % c.save_every == 0 || m.epoch == last);
    if (saving && p.world > 1) engine.barrier("barrier before the checkpoint of epoch " + std::to_string(m.epoch));
    if (saving) opt.gather_state();
    if (saver) {
      for (auto& path : saver->on_epoch_end(engine, opt, ckpt, last)) std::printf("saved %s\n", path.c_str());
      std::fflush(stdout);
    }
    if (saving) saved.epoch = m.epoch;
  };
  train::EpochMetrics m = trainer.run(ckpt.epoch, last, train::EpochPosition{ckpt.batch, ckpt.partial});
  if (trainer.stopped()) return finish_stopped(trainer, engine, opt, p, ckpt, save_dir, saver, saved);
  if (!p.primary()) return 0;
  const GraphStats g = engine.graph_stats();
  if (g.captures > 0 || (engine.devices()[0].is_cuda() && c.cuda_graphs == "auto"))
    std::printf("CUDA graphs: %lld captured, %lld steps replayed, %lld plain%s%s\n",
                static_cast<long long>(g.captures), static_cast<long long>(g.replays), static_cast<long long>(g.plain),
                g.on ? "" : "; off: ", g.on ? "" : g.off_reason.c_str());
  if (last == c.epochs && c.max_steps > 0 && trainer.steps() < c.max_steps)
    std::printf("--epochs %d ended the run after %lld of --max-steps %lld steps\n", c.epochs,
                static_cast<long long>(trainer.steps()), static_cast<long long>(c.max_steps));
  if (last < c.epochs)
    std::printf("stopped after epoch %d of %d (--stop-after); continue with --resume\n", last, c.epochs);
  else
    std::printf("%s\n", train::final_line(m).c_str());
  return 0;
}

// --data opened for --model: a GPT's windows are its block_size; the data
// must suit the model (token ids for a GPT, images for the rest).
data::DataSplits open_run_data(const train::RunConfig& c, const Process& p) {
  models::check_model_name(c.model);  // before blaming the data for a misspelt model
  data::DataSplits data = data::open_data(c.data, c.data_options());
  if (p.primary())
    for (const std::string& w : data.warnings) std::fprintf(stderr, "dp-train: warning: %s\n", w.c_str());
  FANOUT_USER_CHECK(models::is_gpt(c.model) == data.token_data())
      << "model " << c.model << (models::is_gpt(c.model) ? " reads token ids" : " reads images") << " but data "
      << c.data << (data.token_data() ? " is text or tokens (train it with --model gpt:...)" : " is images");
  FANOUT_USER_CHECK(models::dense_output(c.model) == data.train->dense_targets())
      << "model " << c.model << (models::dense_output(c.model) ? " draws heatmaps" : " is a classifier")
      << " but data " << c.data << (data.train->dense_targets() ? " has landmarks" : " has class labels")
      << " (heatmap3d goes with keypoints3d:DIR or synthetic3d)";
  FANOUT_USER_CHECK(!c.drop_last || data.train->size() >= c.batch_size)
      << "--drop-last with --batch-size " << c.batch_size << " would drop every batch: the training set holds "
      << data.train->size() << " samples";
  return data;
}

// The locked save directory. A fresh run into another run's checkpoints
// would mix them (best.safetensors overwritten, --resume picking the other
// run's newest), as would a resume from a checkpoint that later ones follow.
std::unique_ptr<train::CheckpointSaver> open_save_dir(const train::RunConfig& c) {
  const std::string save_to = save_dir_of(c);
  auto saver = with_save_dir_hint(
      c, [&] { return std::make_unique<train::CheckpointSaver>(save_to, c.save_every, c.keep_last); });
  if (const int n = saver->lock().removed_temporaries())
    std::printf("removed %d temporary file%s a run that died while saving left in %s\n", n, n == 1 ? "" : "s",
                save_to.c_str());
  // A resume saves beside the checkpoint it continues: any other directory's checkpoints are another run's.
  const std::string from = c.resume.empty() ? "" : train::resolve_resume_path(c.resume);
  std::error_code ec;
  const std::filesystem::path from_dir = std::filesystem::path(from).parent_path();
  const bool beside = !from.empty() && std::filesystem::equivalent(from_dir.empty() ? "." : from_dir, save_to, ec);
  const std::vector<std::string> others = beside ? std::vector<std::string>{} : saver->checkpoints();
  FANOUT_USER_CHECK(others.empty() || c.overwrite)
      << "--save-dir " << save_to << " holds another run's checkpoints (" << others.front()
      << (others.size() > 1 ? " and " + std::to_string(others.size() - 1) + " more" : std::string()) << "): "
      << (from.empty() ? "continue it with --resume " + save_to + ", or start over with --overwrite"
                       : "save elsewhere, or replace them with --overwrite");
  // Removed when training starts (train_run): a run refused before it leaves them.
  const auto replace = [&](std::vector<std::string> files, const std::string& which) {
    if (files.empty()) return;
    std::printf("%zu checkpoint%s %s in %s %s removed when training starts (--overwrite)\n", files.size(),
                files.size() == 1 ? "" : "s", which.c_str(), save_to.c_str(), files.size() == 1 ? "is" : "are");
    saver->replace(std::move(files));
  };
  if (!others.empty()) {
    std::vector<std::string> paths;
    for (const std::string& name : others) paths.push_back((std::filesystem::path(save_to) / name).string());
    replace(paths, "of an earlier run");
  }
  if (!beside) return saver;
  const std::vector<std::string> later = saver->checkpoints_after(from);
  FANOUT_USER_CHECK(later.empty() || c.overwrite)
      << "--save-dir " << save_to << " holds checkpoints past " << from << " (" << later.back()
      << (later.size() > 1 ? " and " + std::to_string(later.size() - 1) + " more" : std::string())
      << "), which a later --resume " << save_to << " would take over this run's: resume from " << save_to
      << ", save elsewhere, or remove them with --overwrite";
  replace(later, "past " + from);
  return saver;
}

int run(int argc, char** argv) {
  const Cli cli = parse(argc, argv);
  if (cli.help) return 0;
  if (cli.list_devices) return list_devices();
  // Workers inherit both through the environment (a password never on a command line).
  if (!cli.run.iface.empty()) distributed::use_interface(cli.run.iface);
  if (!cli.run.rdzv_password_file.empty()) distributed::read_rdzv_password(cli.run.rdzv_password_file);
  if (cli.run.distributed() && !distributed::worker_env().present) return launch(cli.run, argc, argv);
  train::RunConfig c = restarted(cli.run);

  install_stop_handlers();
  const Process p = this_process(c);
  const auto all = machine_devices(c);
  if (p.primary()) warn_inapplicable(c, cli.given, p, all);
  if (p.primary()) warn_inapplicable_data(c, cli.given, all);
  // The save directory is locked and checked before anything is loaded.
  const std::string save_to = save_dir_of(c);
  std::unique_ptr<train::CheckpointSaver> saver = !save_to.empty() && p.primary() ? open_save_dir(c) : nullptr;
  const data::DataSplits data = open_run_data(c, p);
  if (g_stop_signal && p.world == 1) {  // during the data's preparation (a long text's tokens): nothing trained yet
    std::fprintf(stderr, "dp-train: stopped by %s while the data was prepared, before training; nothing to save\n",
                 g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM");
    return 128 + g_stop_signal;
  }
  settle_with_data(c, p, cli.epochs_from_steps, *data.train);
  if (p.primary()) warn_unused_vocabulary(c, data);
  auto model = models::make_model(c.model, data.train->sample_shape(), static_cast<int>(data.classes), c.seed,
                                  c.checkpoint_activations);
  if (p.primary()) warn_sync_bn_unused(c, *model, p);
  auto engine = make_run_engine(c, *model, p, all, data);
  if (p.primary()) {
    std::printf("fanout dp-train: model %s (%lld parameters) on %s, data %s (%lld train / %lld test, %s)\n",
                c.model.c_str(), static_cast<long long>(model->num_parameters()), names(p.devices).c_str(),
                c.data.c_str(), static_cast<long long>(data.train->size()), static_cast<long long>(data.test->size()),
                data.train->sample_shape().str().c_str());
    if (c.devices == "auto")
      std::printf("devices auto: %s, %s\n", names(all).c_str(),
                  auto_devices(local_batch(c), kernel_thread_budget(), cuda_device_count()).why.c_str());
    if (p.world > 1)
      std::printf("ddp: %d processes (%d per machine) of %zu device%s each, %s\n", p.world,
                  p.env.local_world_size, p.devices.size(), p.devices.size() == 1 ? "" : "s",
                  engine->group_backend().c_str());
    std::fflush(stdout);
  }
  nlohmann::json config = c.checkpoint_config(names(all), p.world);
  record_input_normalization(c, data, config);
  if (data.token_data()) {  // dp-generate decodes with it
    data::TokenMeta vocabulary = data.tokens;
    vocabulary.train_tokens = vocabulary.val_tokens = 0;  // the cache's, not the run's
    config["tokens"] = data::token_meta_json(vocabulary);
  }
  auto opt = train::make_engine_optimizer(*engine, c.optimizer_options());
  auto ckpt = restore(c, *engine, *opt, p, config);
  if (!ckpt) return 0;
  ckpt->run_id = launch_id();
  if (const std::string why = saver ? saver->forget_missing_best(*ckpt) : ""; !why.empty())
    std::printf("%s: the next evaluation writes best.safetensors\n", why.c_str());
  return train_run(c, *engine, *opt, data, p, *ckpt, save_to, saver.get());
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("dp-train", [&] { return run(argc, argv); });
}
