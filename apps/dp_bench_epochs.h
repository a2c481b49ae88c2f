// dp-bench --epochs: real training epochs through the loader, one device
// against DataParallel against DDP (and the hybrid), fanout beside PyTorch,
// each run a fresh process (fanout's runs are dp-train itself), repeats
// interleaved.
#pragma once
#include <cstdint>
#include <string>

namespace fanout::apps {

struct EpochBenchOptions {
  std::string model = "lenet", data = "fashion-mnist", devices = "cpu:2";
  int64_t batch_size = 256;
  int epochs = 1, repeats = 3, warmup = 5, workers = 1;
  uint64_t seed = 0;
  float lr = 0.02f;
  std::string json, plot, python = "python3";
  bool no_ddp = false, no_pytorch = false;
  bool split_invariant = false, allow_tf32 = false, cudnn_benchmark = false;
  int cpu_threads = 0;  // dp-train's --cpu-threads (0: not passed)
  std::string optimizer = "sgd";  // dp-train's --optimizer, and the same torch.optim class
  std::string betas = "0.9,0.999";
  double eps = 1e-8;
  bool amsgrad = false, no_decay_norm_bias = false;
  double clip_grad_norm = 0;
  float clip_grad_value = 0;
  std::string precision = "32";  // dp-train's --precision; PyTorch under torch.autocast (+ GradScaler)
  std::string grad_reduce_dtype = "fp32";  // dp-train's; PyTorch DDP's bf16_compress_hook for bf16
  bool shard_optimizer = false;            // fanout's DP, DDP and hybrid rows with --shard-optimizer
  std::string cuda_graphs = "auto";        // dp-train's --cuda-graphs (passed on unless auto, its default)
};

// Runs the benchmark; prints a progress line per run and the table; writes
// the JSON lines and the plot when asked. Returns the exit status (non-zero
// when a fanout configuration failed).
int run_epoch_bench(const EpochBenchOptions& o);

}  // namespace fanout::apps
