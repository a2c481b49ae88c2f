// dp-train: trains a model-zoo network on a dataset across the given devices
// and prints a summary per epoch. Bad input ends with one line on stderr and
// a non-zero exit status.
#include <boost/program_options.hpp>
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "apps/cli_main.h"
#include "kernels/gemm.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/trainer.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

struct Options {
  std::string model, data, devices, lr_schedule, metrics, progress, config, output_device, dp_comm;
  std::string augment, pin_memory, save_dir, resume, init_from;
  int epochs = 3, stop_after = 0, workers = 1, prefetch = 2, save_every = 1, keep_last = 2;
  bool drop_last = false, non_strict = false;
  int64_t batch_size = 32, eval_batch_size = 1000;
  float lr = 0.02f, momentum = 0.9f, weight_decay = 5e-4f, warmup_epochs = 0, label_smoothing = 0;
  bool nesterov = false, allow_tf32 = false, cudnn_benchmark = false, deterministic = false;
  bool sync_bn = false, list_devices = false, order_by_free_memory = false, split_invariant = false;
  uint64_t seed = 0;
};

train::Progress::Mode parse_progress(const std::string& s) {
  if (s == "auto") return train::Progress::Mode::Auto;
  if (s == "bar") return train::Progress::Mode::Bar;
  if (s == "lines") return train::Progress::Mode::Lines;
  if (s == "off") return train::Progress::Mode::Off;
  FANOUT_FAIL() << "bad --progress '" << s << "' (expected auto, bar, lines or off)";
}

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

std::vector<Device> order_by_free_memory(std::vector<Device> devices) {
  const auto info = cuda_device_info();
  auto free_of = [&](const Device& d) { return info.at(d.index).free_bytes; };
  std::stable_sort(devices.begin(), devices.end(),
                   [&](const Device& a, const Device& b) { return free_of(a) > free_of(b); });
  std::printf("device order by free memory:");
  for (auto& d : devices) std::printf(" %s (%.1f GiB free)", d.str().c_str(), free_of(d) / 1073741824.0);
  std::printf("\n");
  return devices;
}

int run(int argc, char** argv) {
  Options o;
  po::options_description desc(
      "dp-train: data-parallel training on every device of this machine\n\n"
      "Usage: dp-train [options]\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("model", po::value(&o.model)->default_value("lenet"), "mlp, lenet, cnn, resnet18 or resnet18:imagenet")
    ("data", po::value(&o.data)->default_value("fashion-mnist"),
     "fashion-mnist (Debian package dataset-fashion-mnist), fashion-mnist:DIR, cifar10:DIR, synthetic[:N]")
    ("epochs", po::value(&o.epochs)->default_value(3), "epochs to train")
    ("batch-size", po::value(&o.batch_size)->default_value(32), "global batch size")
    ("eval-batch-size", po::value(&o.eval_batch_size)->default_value(1000), "batch size for evaluation")
    ("lr", po::value(&o.lr)->default_value(0.02f, "0.02"), "base learning rate")
    ("momentum", po::value(&o.momentum)->default_value(0.9f, "0.9"), "SGD momentum (0 for none)")
    ("nesterov", po::bool_switch(&o.nesterov), "Nesterov momentum")
    ("weight-decay", po::value(&o.weight_decay)->default_value(5e-4f, "5e-4"), "L2 weight decay, on every parameter as torch.optim.SGD")
    ("lr-schedule", po::value(&o.lr_schedule)->default_value("cosine"),
     "constant, step[:STEP_SIZE[:GAMMA]], multistep:M1,M2,...[:GAMMA] or cosine (stepped per epoch)")
    ("warmup-epochs", po::value(&o.warmup_epochs)->default_value(0.0f, "0"), "linear warm-up length in epochs (per iteration)")
    ("label-smoothing", po::value(&o.label_smoothing)->default_value(0.0f, "0"), "cross-entropy label smoothing in [0, 1)")
    ("seed", po::value(&o.seed)->default_value(0), "seed for initialization and shuffling")
    ("devices", po::value(&o.devices)->default_value("auto"),
     "auto (every GPU, else cpu), cpu, cpu:N (N CPU workers), all, cuda:N, or a list like 0,1,3 or "
     "cuda:0,cuda:1 (a GPU may repeat: 0,0); the first is the primary")
    ("output-device", po::value(&o.output_device), "where outputs are gathered and the loss computed (default: the primary)")
    ("sync-bn", po::bool_switch(&o.sync_bn), "synchronize BatchNorm statistics across replicas")
    ("dp-comm", po::value(&o.dp_comm)->default_value("auto"), "gradient reduction on GPUs: auto, nccl or p2p")
    ("order-by-free-memory", po::bool_switch(&o.order_by_free_memory),
     "make the listed GPU with the most free memory the primary, and print the order")
    ("list-devices", po::bool_switch(&o.list_devices), "print every visible GPU and the peer-access matrix, and exit")
    ("workers", po::value(&o.workers)->default_value(1), "data-loader threads (0: load on the training thread)")
    ("prefetch", po::value(&o.prefetch)->default_value(2), "batches in flight per loader thread")
    ("pin-memory", po::value(&o.pin_memory)->default_value("auto")->implicit_value("on"),
     "page-locked batch buffers: auto (on with GPUs), on, off")
    ("augment", po::value(&o.augment)->default_value("none"),
     "training augmentation: none, or a comma list of crop[:PADDING] (random crop, default padding 4) and flip")
    ("drop-last", po::bool_switch(&o.drop_last), "drop the last training batch when it is smaller")
    ("save-dir", po::value(&o.save_dir), "write epoch-NNNN.safetensors checkpoints (and best.safetensors) here")
    ("save-every", po::value(&o.save_every)->default_value(1), "checkpoint every N epochs (and after the last)")
    ("keep-last", po::value(&o.keep_last)->default_value(2), "keep the newest K epoch checkpoints")
    ("resume", po::value(&o.resume),
     "continue a run from a checkpoint file, or from the newest one in a directory (--epochs counts the whole run)")
    ("stop-after", po::value(&o.stop_after)->default_value(0),
     "stop once epoch N of the run is done (0: run them all); --resume continues it")
    ("init-from", po::value(&o.init_from), "initialize the model's weights from a safetensors file (optimizer state not loaded)")
    ("non-strict", po::bool_switch(&o.non_strict), "with --init-from: load the tensors that fit and list the rest")
    ("metrics", po::value(&o.metrics), "append one JSON object per epoch to this file")
    ("progress", po::value(&o.progress)->default_value("auto"), "auto (a bar on a terminal), bar, lines or off")
    ("allow-tf32", po::bool_switch(&o.allow_tf32), "TF32 tensor cores for matrix products and convolutions on CUDA")
    ("cudnn-benchmark", po::bool_switch(&o.cudnn_benchmark), "search for the fastest cuDNN algorithms")
    ("deterministic", po::bool_switch(&o.deterministic), "only deterministic cuDNN algorithms")
    ("split-invariant", po::bool_switch(&o.split_invariant),
     "CPU devices: the same parameters whatever the device count (weight gradients summed exactly in float64; "
     "no BatchNorm models)")
    ("config", po::value(&o.config), "read options from this file (key = value lines; the command line wins)");
  // clang-format on
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\nExample:\n  dp-train --model cnn --epochs 10 --devices cpu --metrics run.jsonl\n";
    return 0;
  }
  if (vm.count("config")) {
    const std::string path = vm["config"].as<std::string>();
    std::ifstream f(path);
    FANOUT_USER_CHECK(f.good()) << "cannot open config file " << path;
    po::store(po::parse_config_file(f, desc), vm);
  }
  po::notify(vm);

  FANOUT_USER_CHECK(o.epochs > 0) << "--epochs must be positive, got " << o.epochs;
  FANOUT_USER_CHECK(o.batch_size > 0) << "--batch-size must be positive, got " << o.batch_size;
  FANOUT_USER_CHECK(o.eval_batch_size > 0) << "--eval-batch-size must be positive, got " << o.eval_batch_size;
  FANOUT_USER_CHECK(o.lr > 0) << "--lr must be positive, got " << o.lr;
  FANOUT_USER_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1)
      << "--label-smoothing must be in [0, 1), got " << o.label_smoothing;
  FANOUT_USER_CHECK(o.workers >= 0) << "--workers must be non-negative, got " << o.workers;
  FANOUT_USER_CHECK(o.prefetch >= 1) << "--prefetch must be at least 1, got " << o.prefetch;
  FANOUT_USER_CHECK(o.stop_after >= 0) << "--stop-after must be non-negative, got " << o.stop_after;
  FANOUT_USER_CHECK(o.pin_memory == "auto" || o.pin_memory == "on" || o.pin_memory == "off")
      << "bad --pin-memory '" << o.pin_memory << "' (expected auto, on or off)";
  FANOUT_USER_CHECK(o.resume.empty() || o.init_from.empty()) << "--resume and --init-from exclude each other";
  FANOUT_USER_CHECK(!o.non_strict || !o.init_from.empty()) << "--non-strict only applies to --init-from";
  const data::Augment augment = data::parse_augment(o.augment);
  const auto progress = parse_progress(o.progress);

  if (o.list_devices) return list_devices();
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string dev_spec = o.devices;
  if (dev_spec == "auto") dev_spec = cuda_device_count() > 0 ? "all" : "cpu";
  FANOUT_USER_CHECK(!(cvd && std::string(cvd).empty() && dev_spec.rfind("cpu", 0) != 0))
      << "CUDA_VISIBLE_DEVICES is set but empty, so no GPU is visible (unset it, or use --devices cpu)";
  std::vector<Device> devices = parse_devices(dev_spec);
  if (o.order_by_free_memory && devices[0].is_cuda()) devices = order_by_free_memory(devices);
  std::optional<Device> output_device;
  if (!o.output_device.empty()) {
    auto od = parse_devices(o.output_device);
    FANOUT_USER_CHECK(od.size() == 1) << "--output-device takes one device, got '" << o.output_device << "'";
    output_device = od[0];
  }

  data::TrainTest data = data::open_dataset(o.data, o.seed);
  auto model = models::make_model(o.model, data.train.sample_shape(), data.train.num_classes, o.seed);
  std::string dev_names;
  for (auto& d : devices) dev_names += (dev_names.empty() ? "" : ",") + d.str();
  std::printf("fanout dp-train: model %s (%lld parameters) on %s, data %s (%lld train / %lld test, %s)\n",
              o.model.c_str(), static_cast<long long>(model->num_parameters()), dev_names.c_str(),
              o.data.c_str(), static_cast<long long>(data.train.size()), static_cast<long long>(data.test.size()),
              data.train.sample_shape().str().c_str());
  std::fflush(stdout);

  kernels::SgdHyper h;
  h.lr = o.lr;
  h.momentum = o.momentum;
  h.weight_decay = o.weight_decay;
  h.nesterov = o.nesterov;
  MathOptions math{o.allow_tf32, o.cudnn_benchmark, o.deterministic, o.split_invariant};
  // One device without DataParallel options runs the plain engine; anything
  // else (cpu:N, a GPU list, --sync-bn, --output-device) runs DataParallel.
  std::unique_ptr<Engine> engine;
  const bool plain = devices.size() == 1 && !o.sync_bn && !output_device && o.dp_comm == "auto";
  if (plain) {
    if (devices[0].is_cpu()) kernels::set_cpu_blas_threads(cpu_blas_threads(1, math));
    engine = std::make_unique<SingleDeviceEngine>(*model, devices[0], h, LossOptions{o.label_smoothing}, o.seed, math);
  } else {
    DataParallelOptions dpo;
    dpo.output_device = output_device;
    dpo.sync_bn = o.sync_bn;
    dpo.comm = o.dp_comm;
    dpo.seed = o.seed;
    dpo.math = math;
    engine = std::make_unique<DataParallelEngine>(*model, devices, h, LossOptions{o.label_smoothing}, dpo);
  }

  // What a checkpoint records of this run; a resume compares it with the file's.
  const nlohmann::json config = {
      {"model", o.model},         {"data", o.data},           {"epochs", o.epochs},
      {"batch_size", o.batch_size}, {"lr", o.lr},             {"momentum", o.momentum},
      {"weight_decay", o.weight_decay}, {"nesterov", o.nesterov}, {"lr_schedule", o.lr_schedule},
      {"warmup_epochs", o.warmup_epochs}, {"label_smoothing", o.label_smoothing}, {"seed", o.seed},
      {"augment", augment.str()}, {"drop_last", o.drop_last}, {"devices", dev_names}, {"sync_bn", o.sync_bn},
      {"output_device", output_device ? output_device->str() : ""}, {"dp_comm", o.dp_comm},
      {"allow_tf32", o.allow_tf32}, {"cudnn_benchmark", o.cudnn_benchmark}, {"deterministic", o.deterministic},
      {"split_invariant", o.split_invariant}};
  train::CheckpointState ckpt;
  std::string save_dir = o.save_dir;
  if (!o.resume.empty()) {
    const std::string path = train::resolve_resume_path(o.resume);
    if (save_dir.empty() && path != o.resume) save_dir = o.resume;  // resuming from a directory keeps saving there
    ckpt = train::load_checkpoint(path, *engine, [&](const train::CheckpointState& st) {
      const std::string was_model =
          st.config.contains("model") && st.config["model"].is_string() ? st.config["model"].get<std::string>() : "?";
      FANOUT_USER_CHECK(was_model == o.model)
          << "checkpoint " << path << " was trained with --model " << was_model << ", not " << o.model;
    });
    // Split-invariant runs give the same result on any number of CPU devices.
    const bool any_devices = o.split_invariant && ckpt.config.contains("split_invariant") &&
                             ckpt.config["split_invariant"] == true;
    for (auto& [key, value] : config.items())
      if (!(key == "devices" && any_devices) && ckpt.config.contains(key) && ckpt.config[key] != value)
        std::fprintf(stderr, "dp-train: warning: %s was %s in the checkpoint, now %s: the run will not continue exactly\n",
                     key.c_str(), ckpt.config[key].dump().c_str(), value.dump().c_str());
    std::printf("resumed from %s: %d of %d epochs done, %lld steps\n", path.c_str(), ckpt.epoch, o.epochs,
                static_cast<long long>(ckpt.step));
    if (ckpt.epoch >= o.epochs) {
      std::printf("nothing left to train (raise --epochs to train further)\n");
      return 0;
    }
    if (!o.metrics.empty()) {
      const int dropped = train::drop_metrics_after(o.metrics, ckpt.epoch);
      if (dropped > 0)
        std::printf("removed %d line%s after epoch %d from %s (that epoch is trained again)\n", dropped,
                    dropped == 1 ? "" : "s", ckpt.epoch, o.metrics.c_str());
    }
  }
  if (!o.init_from.empty()) {
    const io::LoadReport r = train::load_weights(o.init_from, engine->model(), !o.non_strict);
    std::printf("initialized from %s: %s\n", o.init_from.c_str(), r.summary().c_str());
  }
  ckpt.config = config;
  std::unique_ptr<train::CheckpointSaver> saver;
  if (!save_dir.empty()) saver = std::make_unique<train::CheckpointSaver>(save_dir, o.save_every, o.keep_last);

  train::TrainerConfig tc;
  tc.epochs = o.epochs;
  tc.batch_size = o.batch_size;
  tc.eval_batch_size = o.eval_batch_size;
  tc.seed = o.seed;
  tc.schedule = optim::parse_lr_schedule(o.lr_schedule, o.lr, o.epochs, o.warmup_epochs);
  tc.metrics_path = o.metrics;
  tc.progress = progress;
  tc.workers = o.workers;
  tc.prefetch = o.prefetch;
  tc.pin_memory = o.pin_memory == "on" || (o.pin_memory == "auto" && devices[0].is_cuda());
  tc.augment = augment;
  tc.drop_last = o.drop_last;
  if (!o.metrics.empty()) {
    std::ofstream probe(o.metrics, std::ios::app);
    FANOUT_USER_CHECK(probe.good()) << "cannot open metrics file " << o.metrics;
  }
  FANOUT_USER_CHECK(o.stop_after == 0 || o.stop_after > ckpt.epoch)
      << "--stop-after " << o.stop_after << " but the checkpoint already has " << ckpt.epoch << " epochs done";
  const int last = o.stop_after > 0 ? std::min(o.epochs, o.stop_after) : o.epochs;
  FANOUT_USER_CHECK(last == o.epochs || saver)
      << "--stop-after " << o.stop_after << " without --save-dir would leave nothing to --resume from";
  train::Trainer trainer(tc, *engine, data);
  trainer.on_epoch_end = [&](const train::EpochMetrics& m) {
    ckpt.epoch = m.epoch;
    ckpt.step = engine->optimizer().steps();
    ckpt.metrics = train::metrics_json(m);
    if (saver) {
      for (auto& p : saver->on_epoch_end(*engine, ckpt, last)) std::printf("saved %s\n", p.c_str());
      std::fflush(stdout);
    }
  };
  train::EpochMetrics m = trainer.run(ckpt.epoch, last);
  if (last < o.epochs)
    std::printf("stopped after epoch %d of %d (--stop-after); continue with --resume\n", last, o.epochs);
  else
    std::printf("final test accuracy %.4f\n", m.test_acc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("dp-train", [&] { return run(argc, argv); });
}
