// The training loop: epochs of shuffled batches from a DataLoader through an
// Engine, the learning-rate schedule, evaluation on the test split, a summary
// line per epoch and an optional JSON-lines metrics file. An epoch's batches
// and learning rates depend only on (seed, epoch), so run(first_epoch) after
// restoring a checkpoint continues a run exactly.
#pragma once
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/core/exact_sum.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/optim/grad_scaler.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine.h"
#include "runtime/train/progress.h"

namespace fanout::train {

struct TrainerConfig {
  int epochs = 1;
  int64_t batch_size = 64;
  int64_t eval_batch_size = 1000;
  uint64_t seed = 0;
  bool drop_last = false;
  int accumulate = 1;        // batches per optimizer step (gradient accumulation)
  int timing_warmup = 0;     // steps at the start of each epoch left out of its steady time
  int64_t save_every_steps = 0;  // on_mid_epoch every this many optimizer steps (0: never)
  // The run ends after this many optimizer steps (0: after `epochs`): the
  // epoch in progress ends there (evaluated, summarized, on_epoch_end), and
  // run() returns.
  int64_t max_steps = 0;
  // Evaluation inside epochs (nanoGPT's eval_interval and eval_iters): after
  // every eval_every optimizer steps (0: at epoch ends only) the validation
  // loss on eval_batches batches of batch_size rows (0: the whole set), the
  // same rows each time, spread evenly over the set; reported through
  // on_eval, a summary line and the metrics file.
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  int workers = 0;           // loader threads (0: batches built on the training thread)
  int prefetch = 2;          // batches in flight per worker
  bool pin_memory = false;   // page-locked batch buffers (for GPU engines)
  data::Augment augment;     // training-set augmentation
  // The learning rate's shape over the run. Its rate is the optimizer's
  // (OptimizerOptions::lr, the one source): the Trainer sets base_lr to it,
  // the rate the optimizer was made with, not where an earlier schedule left it.
  optim::LrSchedule schedule;
  // Clipping of the reduced gradient before each optimizer step (0: off):
  // by total L2 norm (torch's clip_grad_norm_) and by value (clip_grad_value_).
  double clip_grad_norm = 0;
  float clip_grad_value = 0;
  // Loss scaling (float16 mixed precision): the Trainer owns a GradScaler
  // with these options; the loss gradient is scaled, the reduced gradient
  // unscaled before clipping, and a step holding inf or NaN is skipped.
  std::optional<optim::GradScalerOptions> loss_scaling;
  std::string metrics_path;  // empty: none
  Progress::Mode progress = Progress::Mode::Auto;
  FILE* summary_out = stdout;  // null: no summary lines (ranks other than 0)
};

// The training and evaluation samplers of one process.
struct TrainerSamplers {
  std::unique_ptr<data::Sampler> train, test;
};

// Where an epoch stands: the batches done and their totals summed over every
// process (exact loss sum, correct, count), as a mid-epoch checkpoint keeps it.
// The count is the samples done: when they are not `batch` batches of the
// trainer's batch size, train_epoch re-batches the rest from that sample.
struct EpochPosition {
  int64_t batch = 0;
  nlohmann::json totals = nlohmann::json::object();  // empty: nothing trained yet
};
// Whether a position's totals mark the epoch after its last batch (a stop in
// its evaluation): nothing is left to train or re-batch there.
inline constexpr const char* kEpochDone = "epoch_done";
inline bool epoch_done(const nlohmann::json& totals) { return totals.is_object() && totals.value(kEpochDone, false); }
// A position's mark for the --eval-every evaluation a stop dropped after its
// last step ({"lr": its rate}): a resumed run runs it first.
inline constexpr const char* kEvalPending = "eval_pending";

// What Trainer::on_step reports after each optimizer step.
struct StepInfo {
  int epoch = 0;       // 0-based
  int64_t batch = 0;   // batches of the epoch done (1-based: the step's last batch)
  int64_t step = 0;    // the run's steps so far (Trainer::steps(): the loss scaler's skipped ones too)
  double loss = 0;     // this process's mean loss over the step's rows (every micro-batch of it)
  int64_t rows = 0;    // those rows
  float lr = 0;        // the learning rate the step used
  double grad_norm = 0;  // the reduced gradient's norm before clipping (clipping by norm only; else 0)
  bool stepped = true;   // false: the loss scaler skipped it (inf/NaN gradients)
};

// Optimizer steps between the ranks' agreements on whether to stop (DDP;
// one process checks after every step).
inline constexpr int64_t kStopCheckSteps = 16;

// One process: a random training order (a function of seed and epoch) and
// the test set in order. Several (engine.world_size() > 1): the training set
// through DistributedSampler (a shard per rank, reshuffled per epoch) and the
// test set split without padding, so per-rank sums add up to the whole set.
TrainerSamplers default_samplers(const TrainerConfig& cfg, const Engine& engine, int64_t train_size,
                                 int64_t test_size);
// Optimizer steps in one full epoch of `train` for this rank: its sampler's
// size over the rank's batch (cfg.batch_size / world; drop_last as set), in
// groups of cfg.accumulate. What --max-steps alone turns into epochs.
int64_t optimizer_steps_per_epoch(const TrainerConfig& cfg, int world, int rank, const data::Dataset& train);

// One replica's memory in bytes. activations: the device's peak since the
// run started less the other kinds and less what the device held besides the
// model then (datasets): layers' outputs and their gradients, scratch, batches
// (replicas on one device, a GPU repeated in the list, share it evenly).
struct ReplicaMemory {
  int64_t params = 0, grads = 0, buffers = 0, optimizer_state = 0, activations = 0;
};

struct EpochMetrics {
  int epoch = 0;  // 1-based
  double train_loss = 0, test_loss = 0;
  // The criterion's metrics (Criterion::metrics()), each with its training
  // and test value; those no pass scored (a zero denominator: mse on
  // outputs that are not heatmaps) are left out of the summary and the
  // metrics file.
  struct Metric {
    MetricSpec spec;
    double train = 0, test = 0;
    bool scored = false;
  };
  std::vector<Metric> metrics;
  std::string loss_format = "%.4g";  // the criterion's, for the summary line
  // A metric's value by key ("acc", "loc_error", "within_2"); 0 without it.
  double train_metric(const std::string& key) const;
  double test_metric(const std::string& key) const;
  // What best.safetensors maximizes: the test value of the criterion's
  // metric that picks_best, else 1 / (1 + test loss) (in (0, 1]).
  double best_score() const;
  double epoch_seconds = 0, images_per_second = 0;
  // Token data (int32 samples of T token ids): T, so that tokens per second
  // are images_per_second * T, and the summary gives tokens/s and the test
  // perplexity exp(test loss); 0 otherwise.
  int64_t tokens_per_sample = 0;
  // The epoch's time without its first timing_warmup steps, scaled to all
  // of its steps; evaluations inside the epoch (eval_every) are left out.
  double steady_epoch_seconds = 0;
  double lr = 0;
  // With clip_grad_norm: the total gradient norm before clipping, mean and max over the epoch's steps
  // (NaN, null in the metrics, when the loss scaler skipped every one).
  bool grad_norms = false;
  double grad_norm_mean = 0, grad_norm_max = 0;
  // With loss scaling: the scale at the epoch's end and the steps it skipped (inf/NaN gradients).
  bool loss_scaling = false;
  double loss_scale = 0;
  int64_t skipped_steps = 0;
  double data_wait_fraction = 0;  // share of the (steady) epoch spent waiting for the loader
  // Peak memory so far: resident host bytes summed over the processes, and
  // the pool high-water mark of each GPU of each process (rank order).
  int64_t peak_host_bytes = 0;
  std::vector<int64_t> peak_device_bytes;
  // CPU devices: each replica's parameters, gradients, buffers and
  // optimizer state in bytes (every process's replicas, rank order).
  std::vector<int64_t> replica_bytes;
  // Every replica's memory by kind (rank order, CPU devices and GPUs).
  std::vector<ReplicaMemory> replica_memory;
  // Image files with skip_bad_samples: the samples replaced so far because
  // their files were bad, summed over the processes; -1: not counted.
  int64_t skipped_samples = -1;
};

// One optimizer step over a whole batch outside the Trainer (tests,
// benchmarks, a user's own loop): engine.forward_backward_batch, clipping
// by total norm when clip_grad_norm > 0 (a non-finite norm is an error) and
// by value when clip_grad_value > 0, then opt.step() at `lr` and opt.zero_grad().
// With a scaler: the loss gradient scaled by its scale, the gradient
// unscaled before clipping, and the step taken or skipped by scaler->step.
StepResult train_step(Engine& engine, optim::Optimizer& opt, const Tensor& x, const Tensor& y, float lr,
                      double clip_grad_norm = 0, float clip_grad_value = 0, optim::GradScaler* scaler = nullptr);

// One evaluation inside an epoch (TrainerConfig::eval_every).
struct EvalMetrics {
  int epoch = 0;          // 1-based: the epoch in progress
  int64_t step = 0;       // optimizer steps so far
  double train_loss = 0;  // mean loss of the rows trained since the previous evaluation (every rank's)
  double val_loss = 0;
  int64_t val_rows = 0;
  std::vector<EpochMetrics::Metric> metrics;  // the criterion's, scored on the validation rows (`test`)
  std::string loss_format = "%.4g";
  int64_t tokens_per_sample = 0;  // as EpochMetrics
  // Training rows per second since the previous evaluation (in this
  // process's run), and training seconds since the run (this process) began;
  // evaluations and their checkpoints left out of both.
  double rows_per_second = 0, elapsed_seconds = 0;
  double lr = 0;
  // What best.safetensors keeps, as EpochMetrics::best_score (a language model: the lowest loss).
  double best_score() const;
};

// The metrics-file object for one epoch.
nlohmann::json metrics_json(const EpochMetrics& m);
// The epoch's summary line (losses, accuracy or localization error, speed, memory).
std::string summary_line(const EpochMetrics& m, int epochs);
// The metrics-file object of an evaluation: {"eval": true, "step", "epoch", "train_loss", "val_loss", ...}.
nlohmann::json eval_json(const EvalMetrics& m);
// "step 250/2000  train loss 2.113  val loss 2.087 ppl 8.06  15210 tokens/s  lr 0.000912" (max_steps 0: "step 250").
std::string eval_line(const EvalMetrics& m, int64_t max_steps);
// The run's last line: the criterion's metrics on the test set ("final test
// accuracy 0.8919"), or its loss when it has none.
std::string final_line(const EpochMetrics& m);
// "peak memory 1.20 GiB host, GPUs 3.10 / 2.90 GiB".
std::string memory_summary(const EpochMetrics& m);

// Before a resumed run appends to a metrics file: removes the lines of epochs
// after `last_epoch` (written by the interrupted run after its checkpoint, and
// about to be trained again), rewriting the file atomically. Lines that are
// not metrics objects are kept, except a last line cut short (no newline, not
// JSON: a write that failed, a full disk), which is removed. Returns how many
// lines were removed; a missing file, or one that is no regular file (a
// stream such as /dev/stdout), removes nothing.
// Evaluation lines inside epochs go by step instead when last_step >= 0:
// those after it are removed.
// `epoch_line` (the checkpoint's own metrics of epoch last_epoch, if it has
// them) is appended when the file lacks that epoch's line; *restored says so.
int drop_metrics_after(const std::string& path, int last_epoch, int64_t last_step = -1,
                       const nlohmann::json* epoch_line = nullptr, bool* restored = nullptr);

// With several processes (engine.world_size() > 1) cfg.batch_size is the
// global batch, split evenly over the ranks; the epoch's statistics are
// summed over every rank, and losses are exact sums (ExactSum) of the rows'
// losses, so they do not depend on how the rows were split.
class Trainer {
 public:
  // `opt` steps engine.model() (the trainer sets its learning rate from the schedule).
  // Any datasets (data::Dataset: images, TensorDataset, a user's own);
  // they must outlive the trainer.
  Trainer(const TrainerConfig& cfg, Engine& engine, optim::Optimizer& opt, const data::Dataset& train,
          const data::Dataset& test, TrainerSamplers samplers = {});
  Trainer(const TrainerConfig& cfg, Engine& engine, optim::Optimizer& opt, const data::TrainTest& data,
          TrainerSamplers samplers = {})
      : Trainer(cfg, engine, opt, data.train, data.test, std::move(samplers)) {}
  // Trains epochs [first_epoch, last_epoch) (last_epoch < 0: cfg.epochs);
  // returns the last epoch's metrics.
  // `start`: a position inside first_epoch to continue from (a mid-epoch
  // checkpoint's); the batches and results are those of the run that was not
  // interrupted.
  EpochMetrics run(int first_epoch = 0, int last_epoch = -1, const EpochPosition& start = {});
  EpochMetrics train_epoch(int epoch, const EpochPosition& start = {});  // 0-based epoch; fills train fields
  // Fills the test fields; the model sees at most the training batch at a
  // time. False when a stop was agreed between its batches
  // (should_stop_evaluating): the fields are then left as they were.
  bool evaluate(EpochMetrics& m);
  void measure_memory(EpochMetrics& m); // fills the peak memory fields and skipped_samples (every rank calls it)
  // At the run's start: restarts the devices' peaks and notes what they
  // hold besides the model and optimizer (activations are measured above it).
  void start_memory();
  std::vector<int64_t> held_before_;  // per device of this process
  // Called after each epoch (checkpointing hooks in here).
  std::function<void(const EpochMetrics&)> on_epoch_end;
  // Polled at optimizer-step boundaries: true stops the run after the step in
  // flight. Under DDP the ranks agree every kStopCheckSteps steps and at each
  // epoch's end, so every rank stops at the same step.
  std::function<bool()> should_stop;
  // Polled between evaluation batches (unset: never): true abandons
  // the evaluation and stops the run. At an epoch's end the checkpoint is
  // then the epoch after its last batch (on_mid_epoch), so a resumed run
  // evaluates it first; inside an epoch (cfg.eval_every) that evaluation is
  // dropped and the run stops after the step. Under DDP the ranks agree every
  // kStopCheckSteps batches of the shortest rank's share.
  std::function<bool()> should_stop_evaluating;
  // On every rank inside an epoch, every save_every_steps optimizer steps and
  // when stopping: the epoch (0-based), the position, and whether the run stops.
  std::function<void(int, const EpochPosition&, bool)> on_mid_epoch;
  // After each optimizer step, on every rank (for a user's own logging).
  std::function<void(const StepInfo&)> on_step;
  // After each evaluation inside an epoch (cfg.eval_every), on every rank,
  // before a checkpoint of the same step is saved (best.safetensors hooks in here).
  std::function<void(const EvalMetrics&)> on_eval;
  // After run(): whether it stopped early, and at which epoch (0-based) and position.
  bool stopped() const { return stopped_; }
  // The loss scaler (cfg.loss_scaling), or null: its state goes into checkpoints.
  optim::GradScaler* grad_scaler() { return scaler_.get(); }
  // The run's steps so far: the optimizer's and those the loss scaler
  // skipped (nanoGPT's iter_num, which its schedule also counts). max_steps,
  // eval_every, save_every_steps and the evaluations' step count these.
  int64_t steps() const {
    return opt_.steps() + skipped_before_ + (scaler_ ? scaler_->skipped() - scaler_base_ : 0);
  }
  // Resuming: the steps skipped before this process (a checkpoint's step
  // minus its optimizer's steps); the scaler's skips count from here. Call
  // after loading the scaler's state.
  void set_steps_skipped_before(int64_t n) {
    skipped_before_ = std::max<int64_t>(0, n);
    scaler_base_ = scaler_ ? scaler_->skipped() : 0;
  }
  int stopped_epoch() const { return stopped_epoch_; }
  const EpochPosition& stopped_at() const { return stopped_at_; }

 private:
  bool stop_agreed(bool every_rank_checks);
  // Between evaluation batches: after batch i of `it` (0-based), whether the
  // ranks agree to stop.
  bool stop_evaluating(int64_t i, const data::DataLoader& it);
  bool steps_done() const { return cfg_.max_steps > 0 && steps() >= cfg_.max_steps; }
  void write_metrics(const nlohmann::json& j);
  // cfg.eval_every's evaluation inside `epoch` (0-based) after the optimizer's step at `lr`.
  // False when a stop came between its batches (the evaluation is dropped).
  bool evaluate_during(int epoch, float lr);
  double seconds_in_run() const;
  struct GradNorms {
    double sum = 0, max = 0;
    int64_t steps = 0;
  };
  // Clipping, the optimizer's step at `lr` and zero_grad, after batch `b` of `epoch` (0-based).
  void optimizer_step(float lr, int epoch, int64_t b, GradNorms& norms, const ExactSum& loss, int64_t rows);
  // A place in an epoch: after batch `batch`, every rank's totals of the
  // epoch so far (as a position carries them) and the gradient norms.
  struct Place {
    int64_t batch = 0;
    nlohmann::json totals;
    GradNorms norms;
  } epoch_end_;  // train_epoch's end, for a stop in the evaluation after it
  // The position at a place (every rank calls it: the rows since an
  // evaluation are summed).
  EpochPosition position(const Place& at);
  int64_t eval_common_batches_ = 0;  // the shortest rank's evaluation batches (DDP)
  // An evaluation failed (a bad file): the training up to `at` is saved
  // first (on_mid_epoch), so the error loses nothing; one process only.
  void save_before_error(int epoch, const Place& at);
  TrainerConfig cfg_;
  Engine& engine_;
  optim::Optimizer& opt_;
  std::unique_ptr<optim::GradScaler> scaler_;
  int64_t skipped_before_ = 0, scaler_base_ = 0;  // steps(): skips before this process, the scaler's count then
  Progress progress_;
  std::unique_ptr<data::DataLoader> train_loader_, test_loader_;
  const data::Dataset* train_set_;  // for skipped_samples
  const data::Dataset* test_set_;
  std::unique_ptr<data::DataLoader> probe_loader_;  // eval_every's validation rows
  // Time: the run's start (this process), the seconds spent evaluating since, and the training time at
  // the previous evaluation inside an epoch.
  std::chrono::steady_clock::time_point run_start_;
  double eval_seconds_ = 0, seconds_at_eval_ = 0;
  // The rows trained since the previous evaluation inside an epoch: this process's (a resumed one's
  // rank 0 also carries what every rank had trained before the checkpoint), their loss exactly.
  ExactSum since_eval_loss_;
  int64_t since_eval_rows_ = 0;
  // Rows this rank trained in this process's run, and every rank's at the previous evaluation.
  int64_t run_rows_ = 0, rows_at_eval_ = 0;
  int64_t tokens_per_sample_ = 0;
  // The rate of the step whose evaluation a stop dropped (positions carry it).
  std::optional<float> pending_eval_lr_;
  bool stopped_ = false;
  int stopped_epoch_ = 0;
  EpochPosition stopped_at_;
  void set_stopped(int epoch, EpochPosition at) {
    stopped_ = true;
    stopped_epoch_ = epoch;
    stopped_at_ = std::move(at);
  }
};

}  // namespace fanout::train
