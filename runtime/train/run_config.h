// RunConfig: every option of a training run, each default stated here once.
// dp-train's command line and config file are made from it, as are the
// options a checkpoint records, the trainer's configuration and the engine.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/context.h"
#include "runtime/core/precision.h"
#include "runtime/data/open_data.h"
#include "runtime/optim/optimizer.h"
#include "runtime/train/trainer.h"

namespace fanout::train {

struct RunConfig {
  // What to train.
  std::string model = "lenet";
  std::string data = "fashion-mnist";
  std::string tokenizer;  // token data: a byte-level BPE's folder (empty: none)
  int epochs = 3;
  int64_t batch_size = 32;  // global: split over processes, then over devices
  int64_t eval_batch_size = 1000;
  int accumulate = 1;       // batches per optimizer step
  uint64_t seed = 0;
  // Optimizer, clipping and schedule.
  std::string optimizer = "sgd";  // sgd, adam or adamw
  float lr = 0.02f, momentum = 0.9f, weight_decay = 5e-4f;
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  bool amsgrad = false;
  bool no_decay_norm_bias = false;
  double clip_grad_norm = 0;  // 0: off
  float clip_grad_value = 0;  // 0: off
  std::string lr_schedule = "cosine";
  float warmup_epochs = 0, label_smoothing = 0;
  int warmup_steps = 0, lr_decay_steps = 0;  // --lr-schedule warmup-cosine
  // warmup-cosine's end: --lr-decay-steps, or --max-steps when it is 0 (nanoGPT's lr_decay_iters = max_iters).
  int decay_steps() const { return lr_decay_steps > 0 ? lr_decay_steps : static_cast<int>(max_steps); }
  bool warmup_cosine() const;  // --lr-schedule is warmup-cosine
  float min_lr = -1;                         // warmup-cosine's floor; < 0: lr / 10
  int heatmap_radius = 2;         // keypoint data: the target Gaussians' radius in voxels
  // Devices and parallelism.
  std::string devices = "auto";
  std::string strategy = "dp";    // dp (one process) or ddp (one process per device, or per group)
  std::string output_device;      // empty: the primary
  bool sync_bn = false;
  bool gather_outputs = false;    // dp: the loss on the output device instead of on each replica
  std::string dp_comm = "auto";
  bool order_by_free_memory = false;
  int nproc_per_node = 0;         // 0: one process per listed device
  int nnodes = 1, node_rank = 0;
  std::string rdzv;               // empty: a fresh directory on this machine
  std::string run_id;
  std::string iface;               // network interface the collectives use (GLOO_/NCCL_SOCKET_IFNAME)
  std::string rdzv_password_file;  // the Redis rendezvous's password, first line (FANOUT_RDZV_PASSWORD)
  std::string ddp_backend = "auto";  // auto, gloo or nccl
  double timeout = 300;           // seconds: rendezvous and every collective
  std::string log_dir;
  int max_restarts = 0;           // ddp: starts of the workers again after one fails, from --save-dir's newest
  bool no_broadcast_buffers = false;
  // Data pipeline.
  int workers = 1, prefetch = 2;
  std::string pin_memory = "auto";
  std::string augment = "none";
  std::string normalize = "imagenet";  // image files: imagenet, none, M,S or M1,M2,M3,S1,S2,S3
  bool skip_bad_samples = false;       // image files: replace an unreadable one instead of ending the run
  bool drop_last = false;
  // Checkpoints and output.
  std::string save_dir, resume, init_from;
  int save_every = 1, keep_last = 2, stop_after = 0;
  int64_t max_steps = 0;  // 0: --epochs decides
  int64_t save_every_steps = 0;
  int64_t eval_every = 0, eval_steps = 0;  // validation inside epochs: every N steps, on K batches (0: all)
  bool non_strict = false;
  bool overwrite = false;  // a fresh run may replace another run's checkpoints in --save-dir
  bool allow_batch_change = false;  // a resume mid-epoch may change the batch size (the rest is re-batched)
  std::string metrics;
  std::string progress = "auto";
  int timing_warmup = 0;  // steps of each epoch left out of its steady time
  // Math.
  bool allow_tf32 = false, cudnn_benchmark = false, deterministic = false, split_invariant = false;
  int cpu_threads = 0;  // CPU devices: threads per device's kernels (0: its share of the cores)
  std::string precision = "32";  // 32, bf16-mixed or 16-mixed (runtime/core/precision.h)
  std::string grad_reduce_dtype = "fp32";  // fp32 or bf16: the type gradient buckets are reduced in
  bool shard_optimizer = false;            // ZeRO-1 over DataParallel's replicas
  bool shard_grads = false;                // ZeRO-2: gradients sharded too (implies shard_optimizer)
  bool checkpoint_activations = false;     // the model's blocks recompute their forward in backward
  std::string cuda_graphs = "auto";        // auto, off or check (runtime/parallel/step_graph.h)

  // Checks value ranges and combinations, with one-line errors.
  void validate() const;
  // --strategy ddp: one process per device (or per group of devices).
  bool distributed() const { return strategy == "ddp"; }
  MathOptions math() const {
    return {allow_tf32, cudnn_benchmark, deterministic, split_invariant, autocast_dtype(parse_precision(precision)),
            cpu_threads};
  }
  optim::OptimizerOptions optimizer_options() const;
  // How --data opens for --model (data::open_data): a GPT's windows are its
  // block_size, its vocabulary the spec's unless it takes the data's.
  data::DataOptions data_options() const;
  // The options that change what a run computes, as a checkpoint records them
  // (a resume warns about each that differs). `device_names` is the device
  // list this process resolved; `world_size` the number of processes.
  nlohmann::json checkpoint_config(const std::string& device_names, int world_size) const;
  // The trainer's configuration; `pin` whether batches go to GPUs.
  TrainerConfig trainer_config(bool pin) const;
};

}  // namespace fanout::train
