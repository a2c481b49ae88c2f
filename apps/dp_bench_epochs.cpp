// dp-bench --epochs (see dp_bench_epochs.h).
#include "apps/dp_bench_epochs.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli_main.h"
#include "models/zoo/zoo.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/data/dataset.h"
#include "runtime/data/open_data.h"
#include "runtime/distributed/child_process.h"
#include "runtime/io/npy.h"
#include "runtime/train/run_config.h"
#include "runtime/train/trainer.h"

namespace fs = std::filesystem;

namespace fanout::apps {

namespace {

std::string self_dir() { return fs::path(self_path()).parent_path().string(); }

// bench/ scripts: $FANOUT_BENCH_DIR, the install tree, then the source tree.
std::string find_script(const std::string& rel) {
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("FANOUT_BENCH_DIR")) dirs.push_back(d);
  dirs.push_back(self_dir() + "/../share/fanout/bench");
#ifdef FANOUT_SOURCE_BENCH_DIR
  dirs.push_back(FANOUT_SOURCE_BENCH_DIR);
#endif
  for (auto& d : dirs)
    if (fs::exists(d + "/" + rel)) return d + "/" + rel;
  FANOUT_FAIL() << "cannot find bench/" << rel << " (set FANOUT_BENCH_DIR to fanout's bench directory)";
}

// Runs argv with stdout and stderr into `log`; the child dies with us.
// Returns its exit status (128 + signal when killed; 127 when it cannot start).
// SIGINT / SIGTERM (InterruptGuard): passed on to the run in flight; the
// benchmark then stops, reports and saves what it has, and removes its
// temporary directory.
int run_logged(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FANOUT_USER_CHECK(fd >= 0) << "cannot create " << log;
  distributed::ChildSpec spec;
  spec.argv = argv;
  spec.out_fd = spec.err_fd = fd;
  spec.death_signal = SIGTERM;
  pid_t pid = -1;
  try {
    pid = distributed::spawn(spec);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  g_child = pid;
  if (g_interrupted) ::kill(pid, g_interrupted);  // arrived between the check and the fork
  const int rc = distributed::wait_exit_code(pid);
  g_child = 0;
  return rc;
}

std::string tail_of(const std::string& path, int lines) {
  std::ifstream f(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(f, l);) all.push_back(l);
  std::string s;
  for (size_t i = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0; i < all.size(); ++i)
    s += "    " + all[i] + "\n";
  return s;
}

std::string last_line(const std::string& path) {
  std::ifstream f(path);
  std::string last;
  for (std::string l; std::getline(f, l);)
    if (l.find_first_not_of(" \t\r") != std::string::npos) last = l;
  return last;
}

// One run's measurements.
struct RunResult {
  // test_acc: the share of test samples (tokens) right; heatmaps: of landmarks within 2 voxels.
  double epoch_seconds = 0, images_per_second = 0, data_wait = 0, test_acc = 0, test_loss = 0;
  double test_loc_error = -1;  // heatmaps: the mean localization error in voxels; -1 otherwise
  int64_t peak_host = 0;
  std::vector<int64_t> peak_device;
};

// One configuration under test.
struct Config {
  std::string framework;  // "fanout" or "pytorch"
  std::string mode;       // "one device", "DP", "DDP", "hybrid"
  std::string label;      // what the table shows
  int processes = 1, replicas = 1;
  std::vector<std::string> argv;  // without the result path
  std::string status = "ok";      // or "not installed ...", "skipped: ...", "failed ..."
  std::vector<RunResult> runs;
  int devices() const { return processes * replicas; }
};

std::string fmt(const char* f, double v) {
  char s[64];
  std::snprintf(s, sizeof s, f, v);
  return s;
}

// Mean over a run's epochs (JSON objects, oldest first) of the steady epoch
// time (the field `seconds`), throughput and data wait; the last epoch's
// accuracy and loss.
RunResult summarize(const std::vector<nlohmann::json>& epochs, const char* seconds, const std::string& path) {
  FANOUT_USER_CHECK(!epochs.empty()) << "no epoch results in " << path;
  RunResult r;
  for (auto& e : epochs) {
    r.epoch_seconds += e[seconds].get<double>();
    r.images_per_second += e["images_per_second"].get<double>();
    r.data_wait += e["data_wait_fraction"].get<double>();
  }
  const double n = static_cast<double>(epochs.size());
  r.epoch_seconds /= n;
  r.images_per_second /= n;
  r.data_wait /= n;
  const nlohmann::json& last = epochs.back();
  if (last.contains("test_within_2")) {  // heatmaps: no class accuracy
    r.test_acc = last["test_within_2"].get<double>();
    r.test_loc_error = last["test_loc_error"].get<double>();
  } else {
    r.test_acc = last.value("test_acc", 0.0);
  }
  r.test_loss = epochs.back()["test_loss"].get<double>();
  return r;
}

// dp-train's metrics file: one object per epoch, peak memory in each.
RunResult parse_fanout_metrics(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> epochs;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("steady_epoch_seconds")) epochs.push_back(std::move(j));
  }
  RunResult r = summarize(epochs, "steady_epoch_seconds", path);
  r.peak_host = epochs.back()["peak_host_bytes"].get<int64_t>();
  r.peak_device = epochs.back()["peak_device_bytes"].get<std::vector<int64_t>>();
  return r;
}

// train_epochs.py's result: {"epochs": [...], "peak_host_bytes", "peak_device_bytes", ...}.
RunResult parse_pytorch_result(const std::string& path) {
  std::ifstream f(path);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  FANOUT_USER_CHECK(j.is_object() && j.contains("epochs") && j["epochs"].is_array()) << "no result in " << path;
  RunResult r = summarize(j["epochs"].get<std::vector<nlohmann::json>>(), "epoch_seconds", path);
  r.peak_host = j["peak_host_bytes"].get<int64_t>();
  r.peak_device = j["peak_device_bytes"].get<std::vector<int64_t>>();
  return r;
}

// An image set as .npy files plus meta.json, for train_epochs.py.
void export_dataset(const data::ImageDataset& train, const data::ImageDataset& test, const std::string& dir) {
  fs::create_directories(dir);
  io::save_npy(dir + "/train_images.npy", train.images.slice(0, train.size()));
  io::save_npy(dir + "/train_labels.npy", train.labels);
  io::save_npy(dir + "/test_images.npy", test.images.slice(0, test.size()));
  io::save_npy(dir + "/test_labels.npy", test.labels);
  std::ofstream m(dir + "/meta.json");
  m << nlohmann::json{{"mean", train.mean}, {"std", train.std}, {"classes", train.num_classes}}.dump() << "\n";
  FANOUT_USER_CHECK(m.good()) << "cannot write " << dir << "/meta.json";
}

// Removes the temporary directory on every way out.
struct TempDir {
  std::string path;
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/dp-bench-XXXXXX";
    FANOUT_USER_CHECK(::mkdtemp(tmpl.data())) << "cannot create a temporary directory like " << tmpl << ": "
                                              << std::strerror(errno);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string join(const std::vector<Device>& ds) {
  std::string s;
  for (auto& d : ds) s += (s.empty() ? "" : ",") + d.str();
  return s;
}

// What every run shares, found and checked before the first one.
struct Setup {
  std::vector<Device> devices;
  bool gpu = false;
  int cores = 0;
  int64_t train_size = 0, test_size = 0;
  int64_t tokens_per_sample = 0;  // a GPT's: its block_size (0 for images)
  bool heatmaps = false;          // dense targets: "test acc" is the share within 2 voxels
  std::string dp_train, plot_script, py_script;
  std::string torch_data;  // train_epochs.py's --data: the exported images, or the token directory
  std::string torch_status = "not asked (--no-pytorch)", torch_version;
  int n() const { return static_cast<int>(devices.size()); }
  // Throughput as the table shows it: images, or a GPT's tokens, per second.
  const char* rate_unit() const { return tokens_per_sample > 0 ? "tok/s" : "img/s"; }
  double rate(const RunResult& r) const {
    return r.images_per_second * static_cast<double>(tokens_per_sample > 0 ? tokens_per_sample : 1);
  }
};

void check_options(EpochBenchOptions& o) {
  FANOUT_USER_CHECK(o.epochs > 0) << "--epochs must be positive, got " << o.epochs;
  FANOUT_USER_CHECK(o.repeats > 0) << "--repeats must be positive, got " << o.repeats;
  FANOUT_USER_CHECK(o.warmup >= 0) << "--warmup must be non-negative, got " << o.warmup;
  FANOUT_USER_CHECK(o.workers >= 0) << "--workers must be non-negative, got " << o.workers;
  FANOUT_USER_CHECK(o.batch_size > 0) << "--batch-size must be positive, got " << o.batch_size;
  FANOUT_USER_CHECK(std::isfinite(o.lr) && o.lr > 0) << "--lr must be positive, got " << o.lr;
  if (!o.json.empty()) check_output_file("--json", o.json);
  if (!o.plot.empty()) {
    if (fs::path(o.plot).extension().empty()) o.plot += ".png";  // what matplotlib would write
    check_output_file("--plot", o.plot);
  }
}

// Why train_epochs.py cannot train `data` (it reads class-labelled image sets
// in memory and token data); empty when it can.
std::string torch_cannot_train(const data::DataSplits& data) {
  if (data.token_data()) return "";
  const auto* images = dynamic_cast<const data::ImageDataset*>(data.train.get());
  if (images && images->dense_targets()) return "skipped: PyTorch's script trains class labels, not keypoint heatmaps";
  if (!images || !images->labels.defined()) return "skipped: PyTorch's script reads in-memory labelled images only";
  return "";
}

// dp-train's warning, before the first run: an epoch of no more batches than --warmup times its last one only.
void warn_long_warmup(const EpochBenchOptions& o, train::RunConfig run, const data::Dataset& train) {
  if (o.warmup == 0) return;
  run.batch_size = o.batch_size;
  train::TrainerConfig batches = run.trainer_config(false);
  batches.accumulate = 1;
  const int64_t n = train::optimizer_steps_per_epoch(batches, 1, 0, train);
  if (o.warmup >= n)
    std::fprintf(stderr, "dp-bench: warning: --warmup %d is not below an epoch's %lld batches: each epoch's time counts "
                 "its last batch only\n", o.warmup, static_cast<long long>(n));
}

// Checks what can be checked before the first run: dp-train, the data, the
// batch split, the plot's script and PyTorch (which gets the data exported).
Setup prepare(const EpochBenchOptions& o, const std::string& tmp) {
  Setup s;
  s.devices = parse_devices(o.devices);
  s.gpu = s.devices[0].is_cuda();
  s.cores = host_cores();
  s.dp_train = self_dir() + "/dp-train";
  FANOUT_USER_CHECK(::access(s.dp_train.c_str(), X_OK) == 0)
      << "cannot find dp-train beside dp-bench (" << s.dp_train << ")";
  train::RunConfig run;
  run.model = o.model;
  run.seed = o.seed;
  const data::DataOptions opts = run.data_options();
  FANOUT_USER_CHECK(!o.data.starts_with("imagefolder:") && !o.data.starts_with("wds:"))
      << "epoch mode reads data held in memory (PyTorch's rows train on the same arrays): for image files time "
      << "dp-train itself, or the loading alone with loader-bench";
  const data::DataSplits data = data::open_data(o.data, opts);
  FANOUT_USER_CHECK(!models::is_gpt(o.model) || data.token_data())
      << "model " << o.model << " reads token ids but data " << o.data << " is images";
  s.train_size = data.train->size();
  s.test_size = data.test->size();
  s.tokens_per_sample = data.token_data() ? opts.block_size : 0;
  s.heatmaps = data.train->dense_targets();
  FANOUT_USER_CHECK(o.batch_size % s.n() == 0 || s.n() == 1)
      << "--batch-size " << o.batch_size << " cannot be split evenly over " << s.n() << " devices";
  if (!o.plot.empty()) {
    s.plot_script = find_script("plot_epochs.py");
    const int rc = run_logged({o.python, s.plot_script, "--check"}, tmp + "/plot-check.log");
    FANOUT_USER_CHECK(rc == 0) << "--plot needs Python with matplotlib: " << last_line(tmp + "/plot-check.log");
  }
  if (!o.no_pytorch) {
    s.py_script = find_script("pytorch/train_epochs.py");
    const std::string log = tmp + "/torch-version.log";
    const int rc = run_logged({o.python, s.py_script, "--version"}, log);
    std::ifstream f(log);
    std::getline(f, s.torch_version);
    const std::string cannot = torch_cannot_train(data);
    if (!cannot.empty()) {  // PyTorch's script cannot train this data, installed or not
      s.torch_status = cannot;
    } else if (rc == 0) {
      s.torch_status = "ok";
      if (data.token_data()) {
        s.torch_data = data.token_dir;
      } else {
        s.torch_data = tmp + "/data";
        export_dataset(dynamic_cast<const data::ImageDataset&>(*data.train),
                       dynamic_cast<const data::ImageDataset&>(*data.test), s.torch_data);
      }
    } else {
      s.torch_status = "not installed";
      s.torch_version.clear();
      if (rc == 127)  // the interpreter itself did not start
        std::fprintf(stderr, "dp-bench: warning: cannot run --python %s: %s; PyTorch's rows say not installed\n",
                     o.python.c_str(), last_line(log).c_str());
    }
  }
  warn_long_warmup(o, run, *data.train);  // after the checks, whose errors are one line
  return s;
}

bool with_ddp(const EpochBenchOptions& o, const Setup& s) { return !o.no_ddp && (s.n() > 1 || s.gpu); }
std::string one_device(const Setup& s) { return s.gpu ? s.devices[0].str() : "cpu"; }
std::string processes(int n) { return std::to_string(n) + " process" + (n > 1 ? "es" : ""); }

// fanout's rows: dp-train on one device, DataParallel, DDP and the hybrid.
void add_fanout_configs(const EpochBenchOptions& o, const Setup& s, std::vector<Config>& configs) {
  std::vector<std::string> common = {
      "--model", o.model, "--data", o.data, "--epochs", std::to_string(o.epochs), "--batch-size",
      std::to_string(o.batch_size), "--lr", fmt("%g", o.lr), "--weight-decay", "5e-4",
      "--lr-schedule", "constant", "--seed", std::to_string(o.seed), "--workers", std::to_string(o.workers),
      "--progress", "off", "--timing-warmup", std::to_string(o.warmup), "--optimizer", o.optimizer,
      "--clip-grad-norm", fmt("%g", o.clip_grad_norm),
      "--clip-grad-value", fmt("%g", o.clip_grad_value), "--precision", o.precision,
      "--grad-reduce-dtype", o.grad_reduce_dtype};
  // The optimizer's own options alone (dp-train warns of the others').
  if (o.optimizer == "sgd")
    common.insert(common.end(), {"--momentum", "0.9"});
  else
    common.insert(common.end(), {"--betas", o.betas, "--eps", fmt("%g", o.eps)});
  auto add = [&](const std::string& mode, const std::string& label, int procs, int reps,
                 std::vector<std::string> extra) {
    Config c{"fanout", mode, label, procs, reps};
    c.argv = {s.dp_train};
    c.argv.insert(c.argv.end(), common.begin(), common.end());
    c.argv.insert(c.argv.end(), extra.begin(), extra.end());
    if (o.split_invariant) c.argv.push_back("--split-invariant");
    if (o.cpu_threads > 0) c.argv.insert(c.argv.end(), {"--cpu-threads", std::to_string(o.cpu_threads)});
    if (o.no_decay_norm_bias) c.argv.push_back("--no-decay-norm-bias");
    if (o.amsgrad) c.argv.push_back("--amsgrad");
    if (o.allow_tf32) c.argv.push_back("--allow-tf32");
    if (o.cudnn_benchmark) c.argv.push_back("--cudnn-benchmark");
    if (o.cuda_graphs != "auto") c.argv.insert(c.argv.end(), {"--cuda-graphs", o.cuda_graphs});
    configs.push_back(std::move(c));
  };
  const int n = s.n();
  const std::string sharded = o.shard_optimizer ? " sharded" : "";
  add("one device", "fanout one device " + one_device(s), 1, 1, {"--devices", one_device(s)});
  if (n > 1) {
    std::vector<std::string> dp = {"--devices", o.devices};
    if (o.shard_optimizer) dp.push_back("--shard-optimizer");
    add("DP", "fanout DP " + join(s.devices) + sharded, 1, n, dp);
  }
  if (!with_ddp(o, s)) return;
  std::vector<std::string> ddp = {"--devices", o.devices, "--strategy", "ddp"};
  if (o.shard_optimizer) ddp.push_back("--shard-optimizer");
  add("DDP", "fanout DDP " + processes(n) + sharded, n, 1, ddp);
  ddp.insert(ddp.end(), {"--nproc-per-node", "2"});
  if (n >= 4 && n % 2 == 0) add("hybrid", "fanout hybrid 2 processes x " + std::to_string(n / 2) + sharded, 2, n / 2, ddp);
}

// PyTorch's rows (bench/pytorch/train_epochs.py): one device in NCHW and in
// channels_last, DDP, and nn.DataParallel on GPUs.
void add_pytorch_configs(const EpochBenchOptions& o, const Setup& s, std::vector<Config>& configs) {
  auto add = [&](const std::string& mode, const std::string& label, int procs, int reps,
                 std::vector<std::string> extra) {
    Config c{"pytorch", mode, label, procs, reps};
    c.argv = {o.python, s.py_script, "--data", s.torch_data, "--model", o.model, "--epochs",
              std::to_string(o.epochs), "--batch", std::to_string(o.batch_size), "--lr", fmt("%g", o.lr),
              "--momentum", "0.9", "--weight-decay", "5e-4", "--seed", std::to_string(o.seed), "--workers",
              std::to_string(o.workers), "--warmup-steps", std::to_string(o.warmup), "--optimizer", o.optimizer,
              "--betas", o.betas, "--eps", fmt("%g", o.eps), "--clip-grad-norm", fmt("%g", o.clip_grad_norm),
              "--clip-grad-value", fmt("%g", o.clip_grad_value), "--precision", o.precision,
              "--grad-reduce-dtype", o.grad_reduce_dtype};
    if (o.amsgrad) c.argv.push_back("--amsgrad");
    if (o.no_decay_norm_bias) c.argv.push_back("--no-decay-norm-bias");
    c.argv.insert(c.argv.end(), extra.begin(), extra.end());
    if (o.allow_tf32) c.argv.push_back("--tf32");
    if (s.torch_status != "ok") c.status = s.torch_status;
    configs.push_back(std::move(c));
  };
  const int n = s.n();
  const std::string one = one_device(s), threads = std::to_string(s.gpu ? 1 : s.cores);
  std::string gpus;
  for (auto& d : s.devices) gpus += (gpus.empty() ? "" : ",") + std::to_string(d.index);
  bool distinct = true;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) distinct = distinct && s.devices[i].index != s.devices[j].index;
  add("one device", "PyTorch one device " + one, 1, 1,
      {"--mode", "one", "--devices", s.gpu ? one : "cpu", "--threads", threads});
  // PyTorch's convolutions run faster on NHWC activations (its oneDNN CPU
  // path, tensor cores): its best one-device configuration for images is this row.
  if (s.tokens_per_sample == 0)
    add("one device", "PyTorch one device " + one + " channels_last", 1, 1,
        {"--mode", "one", "--devices", s.gpu ? one : "cpu", "--threads", threads, "--channels-last"});
  if (with_ddp(o, s)) {
    const bool nccl = s.gpu && distinct;
    add("DDP", "PyTorch DDP " + processes(n) + (nccl ? " (nccl)" : " (gloo)"), n, 1,
        {"--mode", "ddp", "--nproc", std::to_string(n), "--devices", s.gpu ? gpus : "cpu", "--backend",
         nccl ? "nccl" : "gloo", "--threads", std::to_string(s.gpu ? 1 : std::max(1, s.cores / n))});
  }
  if (s.gpu && n > 1) {
    add("DP", "PyTorch DP " + join(s.devices), 1, n, {"--mode", "dp", "--devices", gpus, "--threads", "1"});
    if (!distinct && configs.back().status == "ok") configs.back().status = "skipped: nn.DataParallel needs distinct GPUs";
  }
}

void print_header(const EpochBenchOptions& o, const Setup& s) {
  std::printf("dp-bench --epochs: %s on %s (%lld train / %lld test), global batch %lld, %d epoch%s per run, "
              "%d run%s per configuration, interleaved; %d host cores\n",
              o.model.c_str(), o.data.c_str(), static_cast<long long>(s.train_size),
              static_cast<long long>(s.test_size), static_cast<long long>(o.batch_size), o.epochs,
              o.epochs == 1 ? "" : "s", o.repeats, o.repeats == 1 ? "" : "s", s.cores);
  std::printf("each run is a fresh process; the first %d steps of each epoch are warm-up, left out of its time "
              "(the rest is scaled to the whole epoch); evaluation is not timed%s\n",
              o.warmup, s.torch_status == "ok" ? ("; PyTorch " + s.torch_version).c_str() : "");
  std::fflush(stdout);
}

// Runs every configuration o.repeats times, interleaved (A B C ... A B C
// ...), each a fresh process; SIGINT or SIGTERM stops between runs. Returns
// the signal that stopped it, or 0.
int run_interleaved(const EpochBenchOptions& o, const Setup& s, std::vector<Config>& configs, const std::string& tmp) {
  int total = 0;
  for (auto& c : configs) total += c.status == "ok" ? o.repeats : 0;
  int done = 0, finished = 0;
  InterruptGuard guard;
  for (int r = 0; r < o.repeats && !g_interrupted; ++r)
    for (size_t k = 0; k < configs.size() && !g_interrupted; ++k) {
      Config& c = configs[k];
      if (c.status != "ok") continue;
      const std::string stem = tmp + "/run-" + std::to_string(k) + "-" + std::to_string(r);
      std::vector<std::string> argv = c.argv;
      argv.push_back(c.framework == "fanout" ? "--metrics" : "--out");
      argv.push_back(stem + ".json");
      std::printf("[%d/%d] %s, run %d of %d ... ", ++done, total, c.label.c_str(), r + 1, o.repeats);
      std::fflush(stdout);
      const int rc = run_logged(argv, stem + ".log");
      if (g_interrupted) {
        std::printf("interrupted\n");
        break;
      }
      ++finished;
      if (rc != 0) {
        c.status = "failed (exit status " + std::to_string(rc) + ")";
        std::printf("failed (exit status %d); its last lines:\n%s", rc, tail_of(stem + ".log", 6).c_str());
        std::fflush(stdout);
        continue;
      }
      c.runs.push_back(c.framework == "fanout" ? parse_fanout_metrics(stem + ".json")
                                               : parse_pytorch_result(stem + ".json"));
      const RunResult& x = c.runs.back();
      std::printf("%.2f s/epoch, %.0f %s, %s %.4f\n", x.epoch_seconds, s.rate(x), s.rate_unit(),
                  s.heatmaps ? "test within 2 voxels" : "test acc", x.test_acc);
      std::fflush(stdout);
    }
  const int interrupted = g_interrupted;
  if (interrupted) {
    print_interrupted(interrupted, finished, total, "runs");
    for (auto& c : configs)
      if (c.status == "ok" && c.runs.empty()) c.status = "not run (interrupted)";
  }
  return interrupted;
}

// A configuration's median run, and its speed-up over the same framework's
// fastest one-device configuration.
struct Row {
  const Config* c;
  RunResult med;
  double lo = 0, hi = 0, speedup = 0, efficiency = 0;
};
struct Table {
  std::vector<Row> rows;
  std::map<std::string, double> one_device;  // framework -> its fastest one-device median epoch seconds
  double median_of(const std::string& fw, const std::string& mode) const {
    for (auto& row : rows)
      if (row.c->framework == fw && row.c->mode == mode && !row.c->runs.empty()) return row.med.epoch_seconds;
    return 0;
  }
};

Table tabulate(const std::vector<Config>& configs) {
  Table t;
  for (auto& c : configs) {
    Row row{&c, {}};
    if (!c.runs.empty()) {
      std::vector<RunResult> s = c.runs;
      std::sort(s.begin(), s.end(), [](auto& a, auto& b) { return a.epoch_seconds < b.epoch_seconds; });
      row.med = s[s.size() / 2];
      row.lo = s.front().epoch_seconds;
      row.hi = s.back().epoch_seconds;
      if (c.mode == "one device" &&
          (!t.one_device.count(c.framework) || row.med.epoch_seconds < t.one_device[c.framework]))
        t.one_device[c.framework] = row.med.epoch_seconds;
    }
    t.rows.push_back(row);
  }
  for (auto& row : t.rows)
    if (!row.c->runs.empty() && t.one_device.count(row.c->framework)) {
      row.speedup = t.one_device[row.c->framework] / row.med.epoch_seconds;
      row.efficiency = row.speedup / row.c->devices();
    }
  return t;
}

std::string gib(int64_t b) { return fmt("%.2f", static_cast<double>(b) / 1073741824.0); }

// The table, then the questions this benchmark answers.
void print_table(const Table& t, const Setup& s) {
  const bool gpu = s.gpu;
  std::printf("\n%-38s %9s %15s %9s %8s %6s %6s %8s  %s\n", "configuration", "epoch s", "spread", s.rate_unit(),
              "speed-up", "eff.", "wait", "test acc", gpu ? "peak GiB: host; per GPU" : "peak GiB (host)");
  for (auto& row : t.rows) {
    const Config& c = *row.c;
    if (c.runs.empty()) {
      std::printf("%-38s %s\n", c.label.c_str(), c.status.c_str());
      continue;
    }
    std::string mem = gib(row.med.peak_host);
    for (size_t i = 0; i < row.med.peak_device.size(); ++i)
      mem += (i == 0 ? "; " : " / ") + gib(row.med.peak_device[i]);
    std::printf("%-38s %9.2f %15s %9.0f %7.2fx %6.2f %5.1f%% %8.4f  %s%s\n", c.label.c_str(),
                row.med.epoch_seconds, (fmt("%.2f", row.lo) + "-" + fmt("%.2f", row.hi)).c_str(),
                s.rate(row.med), row.speedup, row.efficiency, 100 * row.med.data_wait, row.med.test_acc,
                mem.c_str(), c.status == "ok" ? "" : ("  (" + c.status + ")").c_str());
  }
  if (s.heatmaps) std::printf("heatmaps: test acc is the share of landmarks within 2 voxels (test_within_2)\n");
  const double f_dp = t.median_of("fanout", "DP"), f_ddp = t.median_of("fanout", "DDP"),
               t_ddp = t.median_of("pytorch", "DDP"), t_dp = t.median_of("pytorch", "DP");
  std::printf("\n");
  if (f_dp > 0 && f_ddp > 0)
    std::printf("fanout DP / fanout DDP epoch time: %.3f (DP is %s)\n", f_dp / f_ddp,
                f_dp <= f_ddp ? "faster or equal" : (fmt("%.1f%% slower", 100 * (f_dp / f_ddp - 1))).c_str());
  if (f_ddp > 0 && t_ddp > 0) std::printf("fanout DDP / PyTorch DDP epoch time: %.3f\n", f_ddp / t_ddp);
  if (f_dp > 0 && t_dp > 0) std::printf("fanout DP / PyTorch DP epoch time: %.3f\n", f_dp / t_dp);
  if (f_dp > 0 && t.one_device.count("pytorch"))
    std::printf("PyTorch's fastest one device / fanout DP epoch time: %.3f\n", t.one_device.at("pytorch") / f_dp);
}

// One JSON line per configuration, appended.
void write_json(const std::string& path, const EpochBenchOptions& o, const Setup& s, const Table& t) {
  // One id per invocation, so that a plot of a file of several takes the latest of each setting.
  const long long run_id =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream f(path, std::ios::app);
  FANOUT_USER_CHECK(f.good()) << "cannot open --json " << path << ": " << std::strerror(errno);
  for (auto& row : t.rows) {
    const Config& c = *row.c;
    std::vector<double> runs;
    for (auto& x : c.runs) runs.push_back(x.epoch_seconds);
    nlohmann::json j = {{"bench", "epochs"},
                        {"framework", c.framework},
                        {"mode", c.mode},
                        {"config", c.label},
                        {"processes", c.processes},
                        {"replicas_per_process", c.replicas},
                        {"status", c.status},
                        {"run_id", run_id},
                        {"model", o.model},
                        {"data", o.data},
                        {"devices", o.devices},
                        {"batch_size", o.batch_size},
                        {"epochs", o.epochs},
                        {"warmup_steps", o.warmup},
                        {"repeats", o.repeats},
                        {"host_cores", s.cores},
                        {"split_invariant", o.split_invariant},
                        {"cpu_threads", o.cpu_threads},
                        {"allow_tf32", o.allow_tf32},
                        {"precision", o.precision},
                        {"grad_reduce_dtype", o.grad_reduce_dtype},
                        {"runs_epoch_seconds", runs}};
    if (c.framework == "pytorch") j["torch"] = s.torch_version;
    if (!c.runs.empty()) {
      j["epoch_seconds"] = row.med.epoch_seconds;
      j["epoch_seconds_min"] = row.lo;
      j["epoch_seconds_max"] = row.hi;
      j["images_per_second"] = row.med.images_per_second;
      if (s.tokens_per_sample > 0) j["tokens_per_second"] = s.rate(row.med);
      j["speedup_vs_one_device"] = row.speedup;
      j["efficiency_per_device"] = row.efficiency;
      j["data_wait_fraction"] = row.med.data_wait;
      j["test_acc"] = row.med.test_acc;  // heatmaps: test_within_2's value, as dp-train's best checkpoint
      if (s.heatmaps) {
        j["test_within_2"] = row.med.test_acc;
        j["test_loc_error"] = row.med.test_loc_error;
      }
      j["test_loss"] = row.med.test_loss;
      j["peak_host_bytes"] = row.med.peak_host;
      j["peak_device_bytes"] = row.med.peak_device;
    }
    f << j.dump() << "\n";
  }
  f.flush();
  FANOUT_USER_CHECK(f.good()) << "cannot write --json " << path << ": " << std::strerror(errno);
}

}  // namespace

int run_epoch_bench(const EpochBenchOptions& options) {
  EpochBenchOptions o = options;
  check_options(o);
  TempDir tmp;
  const Setup s = prepare(o, tmp.path);
  std::vector<Config> configs;
  add_fanout_configs(o, s, configs);
  if (!o.no_pytorch) add_pytorch_configs(o, s, configs);
  print_header(o, s);
  const int interrupted = run_interleaved(o, s, configs, tmp.path);
  const Table table = tabulate(configs);
  print_table(table, s);
  const std::string json = !o.json.empty() || o.plot.empty() ? o.json : tmp.path + "/results.jsonl";
  if (!json.empty()) write_json(json, o, s, table);
  if (!o.plot.empty()) {
    const std::string log = tmp.path + "/plot.log";
    const int rc = run_logged({o.python, s.plot_script, "--json", json, "--out", o.plot}, log);
    FANOUT_USER_CHECK(rc == 0) << "the plot failed: " << last_line(log);
    std::printf("plot: %s\n", o.plot.c_str());
  }
  if (interrupted) return 128 + interrupted;
  for (auto& c : configs)
    if (c.framework == "fanout" && c.status != "ok") return 1;
  return 0;
}

}  // namespace fanout::apps
