// Run configuration: validation and what it derives.
#include "runtime/train/run_config.h"

#include <cmath>
#include <iomanip>
#include <limits>

#include "runtime/core/error.h"
#include "runtime/data/loader.h"
#include "runtime/data/transforms.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/parallel/data_parallel.h"

namespace fanout::train {

namespace {
Progress::Mode parse_progress(const std::string& s) {
  if (s == "auto") return Progress::Mode::Auto;
  if (s == "bar") return Progress::Mode::Bar;
  if (s == "lines") return Progress::Mode::Lines;
  if (s == "off") return Progress::Mode::Off;
  FANOUT_FAIL() << "bad --progress '" << s << "' (expected auto, bar, lines or off)";
}
}  // namespace

void RunConfig::validate() const {
  FANOUT_USER_CHECK(epochs > 0) << "--epochs must be positive, got " << epochs;
  FANOUT_USER_CHECK(batch_size > 0) << "--batch-size must be positive, got " << batch_size;
  FANOUT_USER_CHECK(eval_batch_size > 0) << "--eval-batch-size must be positive, got " << eval_batch_size;
  FANOUT_USER_CHECK(accumulate >= 1) << "--accumulate must be at least 1, got " << accumulate;
  FANOUT_USER_CHECK(lr > 0) << "--lr must be positive, got " << lr;
  FANOUT_USER_CHECK(label_smoothing >= 0 && label_smoothing <= 1)
      << "--label-smoothing must be in [0, 1], got " << std::setprecision(9) << label_smoothing;
  FANOUT_USER_CHECK(heatmap_radius >= 0 && heatmap_radius <= 64)
      << "--heatmap-radius must be in 0..64 voxels, got " << heatmap_radius;
  FANOUT_USER_CHECK(workers >= 0) << "--workers must be non-negative, got " << workers;
  FANOUT_USER_CHECK(cpu_threads >= 0 && cpu_threads <= 1024)
      << "--cpu-threads must be in 0..1024 (0: each device's share of the cores), got " << cpu_threads;
  FANOUT_USER_CHECK(workers <= data::kMaxWorkers)
      << "--workers must be at most " << data::kMaxWorkers << ", got " << workers;
  FANOUT_USER_CHECK(prefetch >= 1 && prefetch <= data::kMaxPrefetch)
      << "--prefetch must be in 1.." << data::kMaxPrefetch << ", got " << prefetch;
  FANOUT_USER_CHECK(std::isfinite(warmup_epochs) && warmup_epochs >= 0 && warmup_epochs <= epochs)
      << "--warmup-epochs must be in [0, --epochs] = [0, " << epochs << "], got " << warmup_epochs;
  FANOUT_USER_CHECK(std::isfinite(lr) && std::isfinite(momentum) && std::isfinite(weight_decay))
      << "--lr, --momentum and --weight-decay must be finite";
  const optim::OptimizerKind kind = optim::parse_optimizer(optimizer);
  FANOUT_USER_CHECK(momentum >= 0) << "--momentum must be non-negative, got " << momentum;
  FANOUT_USER_CHECK(weight_decay >= 0) << "--weight-decay must be non-negative, got " << weight_decay;
  FANOUT_USER_CHECK(std::isfinite(eps) && eps >= 0) << "--eps must be finite and non-negative, got " << eps;
  FANOUT_USER_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)
      << "--betas must each be in [0, 1), got " << beta1 << "," << beta2;
  FANOUT_USER_CHECK(!amsgrad || kind != optim::OptimizerKind::SGD) << "--amsgrad applies to --optimizer adam or adamw";
  FANOUT_USER_CHECK(!nesterov || kind == optim::OptimizerKind::SGD) << "--nesterov applies to --optimizer sgd";
  FANOUT_USER_CHECK(std::isfinite(clip_grad_norm) && clip_grad_norm >= 0)
      << "--clip-grad-norm must be finite and non-negative, got " << clip_grad_norm;
  FANOUT_USER_CHECK(std::isfinite(clip_grad_value) && clip_grad_value >= 0)
      << "--clip-grad-value must be finite and non-negative, got " << clip_grad_value;
  FANOUT_USER_CHECK(timing_warmup >= 0) << "--timing-warmup must be non-negative, got " << timing_warmup;
  FANOUT_USER_CHECK(save_every_steps >= 0) << "--save-every-steps must be non-negative, got " << save_every_steps;
  FANOUT_USER_CHECK(save_every >= 1) << "--save-every must be at least 1, got " << save_every;
  FANOUT_USER_CHECK(keep_last >= 1) << "--keep-last must be at least 1, got " << keep_last;
  FANOUT_USER_CHECK(stop_after >= 0) << "--stop-after must be non-negative, got " << stop_after;
  FANOUT_USER_CHECK(max_steps >= 0) << "--max-steps must be non-negative, got " << max_steps;
  FANOUT_USER_CHECK(eval_every >= 0) << "--eval-every must be non-negative, got " << eval_every;
  FANOUT_USER_CHECK(eval_steps >= 0) << "--eval-steps must be non-negative, got " << eval_steps;
  FANOUT_USER_CHECK(lr_decay_steps >= 0) << "--lr-decay-steps must be non-negative, got " << lr_decay_steps;
  if (warmup_cosine()) {
    FANOUT_USER_CHECK(lr_decay_steps > 0 || max_steps > 0)
        << "--lr-schedule warmup-cosine needs --lr-decay-steps N (nanoGPT's lr_decay_iters), or --max-steps, its "
           "default";
    FANOUT_USER_CHECK(lr_decay_steps > 0 || max_steps <= std::numeric_limits<int>::max())
        << "--max-steps " << max_steps << " is too large for warmup-cosine's default --lr-decay-steps";
    FANOUT_USER_CHECK(warmup_steps >= 0 && warmup_steps < decay_steps())
        << "warmup-cosine needs 0 <= --warmup-steps < --lr-decay-steps" << (lr_decay_steps > 0 ? "" : " (--max-steps)")
        << ", got " << warmup_steps << " and " << decay_steps();
  }
  FANOUT_USER_CHECK(pin_memory == "auto" || pin_memory == "on" || pin_memory == "off")
      << "bad --pin-memory '" << pin_memory << "' (expected auto, on or off)";
  FANOUT_USER_CHECK(resume.empty() || init_from.empty()) << "--resume and --init-from exclude each other";
  FANOUT_USER_CHECK(!non_strict || !init_from.empty()) << "--non-strict only applies to --init-from";
  FANOUT_USER_CHECK(strategy == "dp" || strategy == "ddp")
      << "bad --strategy '" << strategy << "' (expected dp or ddp)";
  FANOUT_USER_CHECK(ddp_backend == "auto" || ddp_backend == "gloo" || ddp_backend == "nccl")
      << "bad --ddp-backend '" << ddp_backend << "' (expected auto, gloo or nccl)";
  FANOUT_USER_CHECK(nproc_per_node >= 0) << "--nproc-per-node must be at least 1, got " << nproc_per_node;
  FANOUT_USER_CHECK(timeout > 0 && timeout <= 86400) << "--timeout must be in (0, 86400] seconds, got " << timeout;
  FANOUT_USER_CHECK(nnodes >= 1) << "--nnodes must be at least 1, got " << nnodes;
  FANOUT_USER_CHECK(distributed() || (nnodes == 1 && node_rank == 0 && rdzv.empty()))
      << "--nnodes, --node-rank and --rdzv need --strategy ddp";
  FANOUT_USER_CHECK(node_rank >= 0 && node_rank < nnodes)
      << "--node-rank " << node_rank << " is outside 0.." << nnodes - 1;
  parse_progress(progress);
  data::parse_augment(augment);
  const Precision prec = parse_precision(precision);
  FANOUT_USER_CHECK(prec == Precision::F32 || !split_invariant)
      << "--precision " << precision << " cannot keep --split-invariant's exactness (its roundings depend on how "
      << "the batch is split); use one or the other";
  parse_cuda_graphs(cuda_graphs);  // a one-line error for anything but auto, off and check
  optim::parse_lr_schedule(lr_schedule, lr, epochs, warmup_epochs);  // before any data or model is opened
  FANOUT_USER_CHECK(parse_grad_reduce_dtype(grad_reduce_dtype) == DType::F32 || !split_invariant)
      << "--grad-reduce-dtype " << grad_reduce_dtype << " cannot keep --split-invariant's exact gradient sums";
}

optim::OptimizerOptions RunConfig::optimizer_options() const {
  const optim::OptimizerKind kind = optim::parse_optimizer(optimizer);
  const bool sgd = kind == optim::OptimizerKind::SGD;
  return {.kind = kind, .lr = lr, .weight_decay = weight_decay, .momentum = sgd ? momentum : 0,
          .nesterov = sgd && nesterov, .beta1 = beta1, .beta2 = beta2, .eps = eps, .amsgrad = amsgrad,
          .no_decay_norm_bias = no_decay_norm_bias, .range = {}};
}

bool RunConfig::warmup_cosine() const {
  return optim::parse_lr_schedule(lr_schedule, lr, epochs, warmup_epochs).kind == optim::LrSchedule::Kind::WarmupCosine;
}

nlohmann::json RunConfig::checkpoint_config(const std::string& device_names, int world_size) const {
  return {{"model", model},
          {"data", data},
          {"tokenizer", tokenizer},
          {"epochs", epochs},
          {"batch_size", batch_size},
          {"accumulate", accumulate},
          {"optimizer", optimizer},
          {"lr", lr},
          {"momentum", momentum},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov},
          {"betas", {beta1, beta2}},
          {"eps", eps},
          {"amsgrad", amsgrad},
          {"no_decay_norm_bias", no_decay_norm_bias},
          {"clip_grad_norm", clip_grad_norm},
          {"clip_grad_value", clip_grad_value},
          {"lr_schedule", lr_schedule},
          {"warmup_epochs", warmup_epochs},
          {"warmup_steps", warmup_steps},
          {"max_steps", max_steps},
          // warmup-cosine's end as this run resolved it (its default follows --max-steps): a resume reports a move.
          {"lr_decay_steps", warmup_cosine() ? decay_steps() : lr_decay_steps},
          {"min_lr", min_lr},
          {"label_smoothing", label_smoothing},
          {"heatmap_radius", heatmap_radius},
          {"seed", seed},
          {"augment", data::parse_augment(augment).str()},
          {"normalize", normalize},
          {"drop_last", drop_last},
          {"devices", device_names},
          {"strategy", strategy},
          {"world_size", world_size},
          {"broadcast_buffers", !no_broadcast_buffers},
          {"sync_bn", sync_bn},
          {"output_device", output_device},
          {"dp_comm", dp_comm},
          {"allow_tf32", allow_tf32},
          {"cudnn_benchmark", cudnn_benchmark},
          {"deterministic", deterministic},
          {"split_invariant", split_invariant},
          {"precision", precision_name(parse_precision(precision))},
          {"grad_reduce_dtype", dtype_name(parse_grad_reduce_dtype(grad_reduce_dtype))}};
}

TrainerConfig RunConfig::trainer_config(bool pin) const {
  TrainerConfig tc{.epochs = epochs, .batch_size = batch_size, .eval_batch_size = eval_batch_size, .seed = seed,
                   .drop_last = drop_last, .accumulate = accumulate, .timing_warmup = timing_warmup,
                   .save_every_steps = save_every_steps, .max_steps = max_steps, .eval_every = eval_every,
                   .eval_batches = eval_steps, .workers = workers, .prefetch = prefetch,
                   .pin_memory = pin_memory == "on" || (pin_memory == "auto" && pin),
                   .augment = data::parse_augment(augment),
                   .schedule = optim::parse_lr_schedule(lr_schedule, lr, epochs, warmup_epochs),
                   .clip_grad_norm = clip_grad_norm, .clip_grad_value = clip_grad_value,
                   .loss_scaling = parse_precision(precision) == Precision::F16Mixed
                                       ? std::optional<optim::GradScalerOptions>(optim::GradScalerOptions{})
                                       : std::nullopt,
                   .metrics_path = metrics, .progress = parse_progress(progress), .summary_out = stdout};
  if (tc.schedule.kind == optim::LrSchedule::Kind::WarmupCosine)
    optim::set_warmup_cosine(tc.schedule, warmup_steps, decay_steps(), min_lr < 0 ? lr / 10 : min_lr);
  return tc;
}

data::DataOptions RunConfig::data_options() const {
  data::DataOptions o;
  o.seed = seed;
  o.heatmap = data::HeatmapSpec{heatmap_radius, 0.0};
  o.augment = data::parse_augment(augment);
  o.normalize = normalize;
  o.skip_bad_samples = skip_bad_samples;
  o.tokenizer = tokenizer;
  if (models::is_gpt(model)) {
    bool from_data = false;
    const models::GPTConfig g = models::parse_gpt_config(models::gpt_spec(model), 1, &from_data);
    o.block_size = g.block_size;
    o.vocab_size = from_data ? 0 : g.vocab_size;
  }
  return o;
}

}  // namespace fanout::train
