// Training loop.
#include "runtime/train/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/exact_sum.h"
#include "runtime/core/memory.h"
#include "runtime/io/file_io.h"
#include "runtime/optim/clip.h"

namespace fanout::train {

namespace {
std::unique_ptr<data::Sampler> default_train_sampler(const TrainerConfig& cfg, int world, int rank, int64_t n) {
  if (world == 1) return std::make_unique<data::RandomSampler>(n, cfg.seed);
  return std::make_unique<data::DistributedSampler>(n, world, rank, /*shuffle=*/true, cfg.seed, cfg.drop_last);
}
}  // namespace

TrainerSamplers default_samplers(const TrainerConfig& cfg, const Engine& engine, int64_t train_size,
                                 int64_t test_size) {
  TrainerSamplers s;
  const int world = engine.world_size(), rank = engine.rank();
  s.train = default_train_sampler(cfg, world, rank, train_size);
  if (world == 1) s.test = std::make_unique<data::SequentialSampler>(test_size);
  else s.test = std::make_unique<data::ShardSampler>(test_size, world, rank);
  return s;
}

int64_t optimizer_steps_per_epoch(const TrainerConfig& cfg, int world, int rank, const data::Dataset& train) {
  FANOUT_USER_CHECK(world >= 1 && cfg.batch_size >= world && cfg.accumulate >= 1)
      << "batch size " << cfg.batch_size << " over " << world << " processes, " << cfg.accumulate << " per step";
  // The default samplers' sizes without their shuffles (O(n) for token data).
  const std::unique_ptr<data::Sampler> s = train.training_sampler(world, rank, cfg.seed, cfg.drop_last);
  const int64_t n = s ? s->size()
                  : world == 1 ? train.size()
                               : data::DistributedSampler::samples_per_replica(train.size(), world, cfg.drop_last);
  const int64_t b = cfg.batch_size / world;
  const int64_t batches = cfg.drop_last ? n / b : (n + b - 1) / b;
  return (batches + cfg.accumulate - 1) / cfg.accumulate;
}

namespace {
// eval_every's validation rows: `rows` indices spread evenly over [0, n) (floor(i n / rows)), this rank's
// share r, r + R, ... of them, in order, the same every epoch.
class EvenSubsetSampler : public data::Sampler {
 public:
  EvenSubsetSampler(int64_t n, int64_t rows, int world, int rank) {
    for (int64_t i = rank; i < rows; i += world) order_.push_back(i * n / rows);  // i n < 2^63: n, rows are row counts
  }
  void set_epoch(int64_t) override {}
  std::vector<int64_t> indices() const override { return order_; }
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }

 private:
  std::vector<int64_t> order_;
};
}  // namespace

Trainer::Trainer(const TrainerConfig& cfg, Engine& engine, optim::Optimizer& opt, const data::Dataset& train,
                 const data::Dataset& test, TrainerSamplers samplers)
    : cfg_(cfg), engine_(engine), opt_(opt), progress_(cfg.progress), train_set_(&train), test_set_(&test) {
  if (train.input_dtype() == DType::I32) tokens_per_sample_ = train.sample_shape().numel();
  if (cfg.loss_scaling) scaler_ = std::make_unique<optim::GradScaler>(*cfg.loss_scaling);
  cfg_.schedule.base_lr = opt.initial_lr();
  FANOUT_CHECK(&opt.model() == &engine.model()) << "the optimizer does not step the engine's model";
  FANOUT_USER_CHECK(std::isfinite(cfg.clip_grad_norm) && cfg.clip_grad_norm >= 0)
      << "the norm to clip gradients to must be non-negative, got " << cfg.clip_grad_norm;
  FANOUT_USER_CHECK(std::isfinite(cfg.clip_grad_value) && cfg.clip_grad_value >= 0)
      << "the value to clip gradients to must be non-negative, got " << cfg.clip_grad_value;
  FANOUT_USER_CHECK(cfg.batch_size > 0) << "batch size must be positive, got " << cfg.batch_size;
  FANOUT_USER_CHECK(cfg.epochs > 0) << "epochs must be positive, got " << cfg.epochs;
  FANOUT_USER_CHECK(cfg.accumulate >= 1) << "gradient accumulation needs at least 1 batch per step, got " << cfg.accumulate;
  FANOUT_USER_CHECK(train.size() > 0) << "the training set is empty";
  FANOUT_USER_CHECK(test.size() > 0) << "the test set is empty (each epoch ends with an evaluation on it)";
  const int world = engine.world_size();
  FANOUT_USER_CHECK(cfg.batch_size % world == 0)
      << "the batch size " << cfg.batch_size << " cannot be split evenly over " << world << " processes";
  if (!samplers.train) samplers.train = train.training_sampler(world, engine.rank(), cfg.seed, cfg.drop_last);
  if (!samplers.train || !samplers.test) {
    TrainerSamplers d = default_samplers(cfg, engine, train.size(), test.size());
    if (!samplers.train) samplers.train = std::move(d.train);
    if (!samplers.test) samplers.test = std::move(d.test);
  }
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size / world;
  lo.workers = cfg.workers;
  lo.prefetch = cfg.prefetch;
  lo.drop_last = cfg.drop_last;
  lo.pin_memory = cfg.pin_memory;
  lo.augment = cfg.augment;
  lo.seed = cfg.seed;
  lo.batch_name = "batch (--batch-size over the processes)";
  train_loader_ = std::make_unique<data::DataLoader>(train, std::move(samplers.train), lo);
  data::LoaderOptions eo = lo;
  eo.batch_size = cfg.eval_batch_size;
  eo.drop_last = false;
  eo.augment = {};
  eo.batch_name = "evaluation batch (--eval-batch-size)";
  test_loader_ = std::make_unique<data::DataLoader>(test, std::move(samplers.test), eo);
  FANOUT_USER_CHECK(cfg.eval_every >= 0) << "--eval-every must be non-negative, got " << cfg.eval_every;
  FANOUT_USER_CHECK(cfg.eval_batches >= 0) << "--eval-steps must be non-negative, got " << cfg.eval_batches;
  if (cfg.eval_every > 0) {
    const int64_t rows = cfg.eval_batches > 0 ? std::min(test.size(), cfg.eval_batches * cfg.batch_size) : test.size();
    probe_loader_ = std::make_unique<data::DataLoader>(
        test, std::make_unique<EvenSubsetSampler>(test.size(), rows, world, engine.rank()), eo);
  }
}

namespace {
// This process's sums (exact loss, rows, the criterion's own sums), summed over every process.
struct Totals {
  StepResult r;
  void add(const StepResult& s) { r.merge(s); }
  void all_reduce(Engine& engine) {
    std::vector<int64_t> v(r.loss.slots().begin(), r.loss.slots().end());
    for (const ExactSum& s : r.sums) v.insert(v.end(), s.slots().begin(), s.slots().end());
    v.push_back(r.count);
    engine.all_reduce_stats(v, "epoch statistics");
    auto it = v.begin();
    auto take = [&it](ExactSum& s) {
      std::copy(it, it + ExactSum::kSlots, s.slots().begin());
      it += ExactSum::kSlots;
    };
    take(r.loss);
    for (ExactSum& s : r.sums) take(s);
    r.count = v.back();
    r.loss_sum = r.loss.value();
  }
  // The criterion's sums by the names it gives them (Criterion::sum_names).
  nlohmann::json to_json(const std::vector<std::string>& names) const {
    nlohmann::json j = {{"loss", std::vector<int64_t>(r.loss.slots().begin(), r.loss.slots().end())},
                        {"count", r.count}};
    for (size_t i = 0; i < names.size() && i < r.sums.size(); ++i)
      j[names[i]] = std::vector<int64_t>(r.sums[i].slots().begin(), r.sums[i].slots().end());
    return j;
  }
  // A sum missing from the checkpoint is zero; one written as an integer
  // (checkpoints before the criteria named their sums) is that count.
  static Totals from_json(const nlohmann::json& j, const std::vector<std::string>& names) {
    Totals t;
    if (j.empty()) return t;
    auto slots_ok = [&](const char* key) {
      return j[key].is_array() && j[key].size() == ExactSum::kSlots;
    };
    bool ok = j.is_object() && j.contains("loss") && slots_ok("loss") && j.contains("count") &&
              j["count"].is_number_integer();
    for (size_t i = 0; ok && i < names.size(); ++i) {
      const char* key = names[i].c_str();
      ok = !j.contains(key) || j[key].is_number_integer() || slots_ok(key);
    }
    FANOUT_USER_CHECK(ok) << "checkpoint: the epoch's partial totals are malformed";
    for (int i = 0; i < ExactSum::kSlots; ++i) t.r.loss.slots()[i] = j["loss"][i].get<int64_t>();
    for (size_t i = 0; i < names.size() && i < t.r.sums.size(); ++i) {
      if (!j.contains(names[i])) {
        // Written before cross_entropy counted its targets: every row was counted.
        if (names[i] == "targets") t.r.sums[i].add_count(j["count"].get<int64_t>());
        continue;
      }
      const nlohmann::json& v = j[names[i]];
      if (v.is_number_integer())
        t.r.sums[i].add_count(v.get<int64_t>());
      else
        for (int k = 0; k < ExactSum::kSlots; ++k) t.r.sums[i].slots()[k] = v[k].get<int64_t>();
    }
    t.r.count = j["count"].get<int64_t>();
    t.r.loss_sum = t.r.loss.value();
    return t;
  }
  double mean_loss() const { return r.count ? r.loss.value() / r.count : 0; }
  // Training's: the rows whose loss was not finite (a step the loss scaler
  // skips) are left out, as the scaler leaves out their gradients.
  double mean_trained_loss() const {
    const int64_t n = r.count - r.loss.non_finite();
    return n > 0 ? r.loss.finite_value() / static_cast<double>(n) : r.count ? std::nan("") : 0;
  }
  double denominator(const MetricSpec& m) const {
    return m.denominator == MetricSpec::kRows ? static_cast<double>(r.count) : r.sums.at(m.denominator).value();
  }
  double ratio(const MetricSpec& m) const {
    const double d = denominator(m);
    return d != 0 ? r.sums.at(m.numerator).value() / d : 0;
  }
};

// The rows trained since the previous evaluation inside an epoch, summed over every process.
Totals rows_since_eval(Engine& engine, const ExactSum& loss, int64_t rows) {
  Totals t;
  t.r.loss = loss;
  t.r.count = rows;
  t.all_reduce(engine);
  return t;
}

// A printf format with exactly one floating-point conversion ("acc %.4f",
// "(%.1f%% within 2)"), safe to give one double.
bool valid_value_format(const std::string& f) {
  int conversions = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') continue;
    if (i + 1 < f.size() && f[i + 1] == '%') {
      ++i;
      continue;
    }
    size_t j = f.find_first_not_of("-+ #0123456789.", i + 1);
    if (j == std::string::npos || std::string("fFeEgGaA").find(f[j]) == std::string::npos) return false;
    ++conversions;
    i = j;
  }
  return conversions == 1;
}

// The criterion's metrics, checked: sums in range, formats safe for one double.
std::vector<MetricSpec> checked_metrics(const Criterion& c) {
  std::vector<MetricSpec> specs = c.metrics();
  for (const MetricSpec& spec : specs) {
    const bool sums_ok = spec.numerator >= 0 && spec.numerator < kMetricSums &&
                         spec.denominator >= MetricSpec::kRows && spec.denominator < kMetricSums;
    FANOUT_USER_CHECK(sums_ok && !spec.key.empty() && valid_value_format(spec.summary) &&
                      valid_value_format(spec.final))
        << "criterion " << c.name() << ": metric '" << spec.key << "' needs a key, sums in [0, " << kMetricSums
        << ") and formats with one floating-point conversion (e.g. \"acc %.4f\")";
  }
  return specs;
}

// The criterion's metrics in `metrics`, one entry per metric it declares,
// scored by this pass when its denominator is nonzero.
void score(std::vector<EpochMetrics::Metric>& metrics, const std::vector<MetricSpec>& specs, const Totals& t,
           bool test) {
  if (metrics.empty())
    for (const MetricSpec& spec : specs) metrics.push_back({spec});
  for (EpochMetrics::Metric& x : metrics) {
    (test ? x.test : x.train) = t.ratio(x.spec);
    x.scored = x.scored || t.denominator(x.spec) != 0;
  }
}
}  // namespace

double EpochMetrics::train_metric(const std::string& key) const {
  for (const Metric& x : metrics)
    if (x.spec.key == key) return x.train;
  return 0;
}

namespace {
double best_of(const std::vector<EpochMetrics::Metric>& metrics, double loss) {
  for (const EpochMetrics::Metric& x : metrics)
    if (x.scored && x.spec.picks_best) return x.test;
  return 1.0 / (1.0 + loss);
}
}  // namespace

double EpochMetrics::best_score() const { return best_of(metrics, test_loss); }
double EvalMetrics::best_score() const { return best_of(metrics, val_loss); }

double EpochMetrics::test_metric(const std::string& key) const {
  for (const Metric& x : metrics)
    if (x.spec.key == key) return x.test;
  return 0;
}

nlohmann::json metrics_json(const EpochMetrics& m) {
  nlohmann::json j = {{"epoch", m.epoch},
          {"train_loss", m.train_loss},
          {"test_loss", m.test_loss},
          {"epoch_seconds", m.epoch_seconds},
          {"images_per_second", m.images_per_second},
          {"steady_epoch_seconds", m.steady_epoch_seconds},
          {"data_wait_fraction", m.data_wait_fraction},
          {"lr", m.lr},
          {"peak_host_bytes", m.peak_host_bytes},
          {"peak_device_bytes", m.peak_device_bytes},
          {"replica_bytes", m.replica_bytes}};
  nlohmann::json memory = nlohmann::json::array();
  for (const ReplicaMemory& r : m.replica_memory)
    memory.push_back({{"params", r.params}, {"grads", r.grads}, {"buffers", r.buffers},
                      {"optimizer_state", r.optimizer_state}, {"activations", r.activations}});
  j["replica_memory"] = memory;
  if (m.tokens_per_sample > 0) {
    j["tokens_per_second"] = m.images_per_second * static_cast<double>(m.tokens_per_sample);
    j["test_perplexity"] = std::exp(m.test_loss);
  }
  if (m.grad_norms) {  // null: no step of the epoch measured one (each was skipped)
    j["grad_norm_mean"] = std::isnan(m.grad_norm_mean) ? nlohmann::json() : nlohmann::json(m.grad_norm_mean);
    j["grad_norm_max"] = std::isnan(m.grad_norm_max) ? nlohmann::json() : nlohmann::json(m.grad_norm_max);
  }
  if (m.loss_scaling) {
    j["loss_scale"] = m.loss_scale;
    j["skipped_steps"] = m.skipped_steps;
  }
  if (m.skipped_samples >= 0) j["skipped_samples"] = m.skipped_samples;
  for (const EpochMetrics::Metric& x : m.metrics)
    if (x.scored) {
      j["train_" + x.spec.key] = x.train;
      j["test_" + x.spec.key] = x.test;
    }
  return j;
}

nlohmann::json eval_json(const EvalMetrics& m) {
  nlohmann::json j = {{"eval", true},
                      {"step", m.step},
                      {"epoch", m.epoch},
                      {"train_loss", m.train_loss},
                      {"val_loss", m.val_loss},
                      {"val_rows", m.val_rows},
                      {"elapsed_seconds", m.elapsed_seconds},
                      {"lr", m.lr}};
  if (m.tokens_per_sample > 0) {
    j["tokens_per_second"] = m.rows_per_second * static_cast<double>(m.tokens_per_sample);
    j["val_perplexity"] = std::exp(m.val_loss);
  } else {
    j["images_per_second"] = m.rows_per_second;
  }
  for (const EpochMetrics::Metric& x : m.metrics)
    if (x.scored) j["val_" + x.spec.key] = x.test;
  return j;
}

int drop_metrics_after(const std::string& path, int last_epoch, int64_t last_step, const nlohmann::json* epoch_line,
                       bool* restored) {
  if (restored) *restored = false;
  // A stream (/dev/stdout, a pipe, a terminal) holds no earlier lines to rewrite, and reading one would
  // wait for ever (its writer is this process).
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  std::ifstream in(path);
  if (!in.is_open()) return 0;
  std::string kept, line;
  int dropped = 0;
  bool has_epoch = false;
  bool unterminated = false;  // the last line lacks its newline: rewritten with it, or the next line joins it
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    unterminated = in.eof();
    if (j.is_discarded() && in.eof()) {  // the last line, without its newline: a write cut short
      ++dropped;
      continue;
    }
    const bool eval = j.is_object() && j.contains("eval") && last_step >= 0;
    const bool epoch = j.is_object() && !j.contains("eval") && j.contains("epoch") && j["epoch"].is_number_integer();
    const bool after = eval ? j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() > last_step
                            : epoch && j["epoch"].get<int64_t>() > last_epoch;
    if (after) {
      ++dropped;
      continue;
    }
    has_epoch = has_epoch || (epoch && j["epoch"].get<int64_t>() == last_epoch);
    kept += line + "\n";
  }
  FANOUT_USER_CHECK(in.eof()) << "cannot read metrics file " << path;
  bool changed = dropped > 0 || unterminated;
  if (epoch_line && !has_epoch && epoch_line->is_object() && epoch_line->value("epoch", -1) == last_epoch &&
      !epoch_line->contains("eval")) {
    kept += epoch_line->dump() + "\n";
    changed = true;
    if (restored) *restored = true;
  }
  if (changed) io::write_file_atomic(path, kept);
  return dropped;
}

namespace {
struct Stepped {
  bool stepped = true;
  double norm = 0;  // before clipping; 0 without clipping by norm
};

// The optimizer's step at `lr` on the reduced gradient, clipped by total norm
// (max_norm > 0) and by value (max_value > 0) first, then zero_grad. A
// non-finite norm is an error, what(norm) its text (formatted only then:
// nothing per step). With a scaler the gradient is unscaled first, and a
// gradient holding inf or NaN skips clipping and the step (scaler->step).
template <class What>
Stepped clipped_step(optim::Optimizer& opt, optim::GradScaler* scaler, float lr, double max_norm, float max_value,
                     What&& what) {
  opt.set_lr(lr);
  Stepped r;
  if (!scaler || scaler->unscale(opt)) {
    if (max_norm > 0) {
      r.norm = optim::clip_grad_norm(opt, max_norm);
      FANOUT_USER_CHECK(std::isfinite(r.norm)) << what(r.norm);
    }
    if (max_value > 0) optim::clip_grad_value(opt, max_value);
  }
  if (scaler)
    r.stepped = scaler->step(opt);
  else
    opt.step();
  opt.zero_grad();
  return r;
}

float loss_gradient_scale(const optim::GradScaler* scaler) { return scaler ? scaler->scale() : 1.0f; }

// The rate of the step at `position` of `epoch` (per_epoch steps), the run's step `run_step`: per run step
// (warmup-cosine) the run's own count, which a resume continues exactly, even after an epoch cut short by
// --max-steps or a batch-size change; per epoch the position in the epoch.
float rate(const optim::LrSchedule& s, int epoch, int64_t position, int64_t per_epoch, int64_t run_step) {
  return s.per_run_step() ? s.at_run_step(run_step)
                          : s.at(epoch, static_cast<int>(position), static_cast<int>(per_epoch));
}
}  // namespace

StepResult train_step(Engine& engine, optim::Optimizer& opt, const Tensor& x, const Tensor& y, float lr,
                      double clip_grad_norm, float clip_grad_value, optim::GradScaler* scaler) {
  const float rows = static_cast<float>(x.size(0) * engine.world_size());
  StepResult r = engine.forward_backward(x, y, loss_gradient_scale(scaler) / rows, true);
  clipped_step(opt, scaler, lr, clip_grad_norm, clip_grad_value, [](double norm) {
    return "the gradient norm is " + std::to_string(norm) + ": non-finite gradients";
  });
  return r;
}

void Trainer::optimizer_step(float lr, int epoch, int64_t b, GradNorms& norms, const ExactSum& loss, int64_t rows) {
  const Stepped s = clipped_step(opt_, scaler_.get(), lr, cfg_.clip_grad_norm, cfg_.clip_grad_value, [&](double n) {
    return "training diverged: the gradient norm is " + std::to_string(n) + " at epoch " + std::to_string(epoch + 1) +
           " step " + std::to_string(b + 1) + " (try a smaller learning rate)";
  });
  // Gradients never finite again: the scale halves towards zero and nothing trains.
  FANOUT_USER_CHECK(s.stepped || scaler_->scale() >= std::numeric_limits<float>::min())
      << "training diverged: the loss scaler skipped every step until its scale fell to " << scaler_->scale()
      << " at epoch " << epoch + 1 << " step " << b + 1 << " (inf or NaN in every step's loss or gradients; try a "
      << "smaller learning rate)";
  if (cfg_.clip_grad_norm > 0 && s.stepped) {
    norms.sum += s.norm;
    norms.max = std::max(norms.max, s.norm);
    ++norms.steps;
  }
  if (on_step) on_step(StepInfo{epoch, b + 1, steps(), rows ? loss.value() / rows : 0, rows, lr, s.norm, s.stepped});
}

bool Trainer::stop_agreed(bool every_rank_checks) {
  const bool local = should_stop && should_stop();
  if (engine_.world_size() == 1) return local;
  if (!every_rank_checks) return false;
  std::vector<int64_t> v{local ? 1 : 0};
  engine_.all_reduce_stats(v, "the stop check");
  return v[0] > 0;
}

EpochMetrics Trainer::train_epoch(int epoch, const EpochPosition& start) {
  EpochMetrics m;
  m.epoch = epoch + 1;
  data::DataLoader& it = *train_loader_;
  const int64_t batch = it.options().batch_size;
  const int k = cfg_.accumulate;
  const Criterion& criterion = engine_.criterion();
  const std::vector<MetricSpec> metrics = checked_metrics(criterion);
  const int world = engine_.world_size();
  // The totals of the batches done before a resume are every rank's: rank 0 carries them.
  const Totals before = Totals::from_json(start.totals, criterion.sum_names());
  Totals t = engine_.rank() == 0 ? before : Totals{};
  const int64_t carried = before.r.count;  // rows over every rank before this call
  // A resume is at `carried` samples of the epoch. Batches of this run's
  // size: at batch carried / (batch * world). Otherwise the batch size
  // changed (--allow-batch-change): the rest of the epoch is re-batched from
  // that sample, every rank at its share of it, and batches count from there.
  // A position after the epoch's last batch (a stop in its evaluation) trains nothing, whatever the batch size.
  const bool epoch_done = train::epoch_done(start.totals);
  const bool rebatched =
      !epoch_done && start.batch > 0 && !start.totals.empty() && carried != start.batch * batch * world;
  int64_t first_sample = 0;  // of this rank's order
  if (rebatched) {
    // train::resume_run (runtime/train/resume.h) refuses this before training, naming the checkpoint.
    FANOUT_CHECK(carried % world == 0) << "cannot continue epoch " << epoch + 1 << " after " << carried
                                       << " samples on " << world << " processes (train::resume_run checks this)";
    first_sample = carried / world;
  }
  it.start_epoch(epoch, epoch_done ? std::numeric_limits<int64_t>::max() : rebatched ? 0 : start.batch, first_sample);
  const int64_t nb = it.num_batches();
  const int64_t total = it.num_samples();
  // The schedule counts optimizer steps; a re-batched rest continues from
  // the steps its samples would have taken in batches of this size.
  const int64_t steps_before = rebatched ? carried / (batch * world * k) : 0;
  const int64_t opt_steps = steps_before + (nb + k - 1) / k;
  auto rows_of = [&](int64_t b) { return std::min(batch, total - b * batch); };
  Tensor x, y;
  FANOUT_USER_CHECK(epoch_done || rebatched || start.batch <= nb)
      << "cannot continue epoch " << epoch + 1 << " after batch " << start.batch << ": this data has " << nb
      << " batches an epoch (the checkpoint's had more)";
  const int64_t b0 = epoch_done ? nb : rebatched ? 0 : std::min(start.batch, nb);
  // --max-steps: the bar ends where the run does.
  const int64_t shown = cfg_.max_steps > 0 ? std::min(nb, b0 + std::max<int64_t>(0, cfg_.max_steps - steps()) * k) : nb;
  progress_.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg_.epochs), shown,
                  std::min(total, shown * batch), tokens_per_sample_);
  const auto t0 = std::chrono::steady_clock::now();
  const double eval_seconds_before = eval_seconds_;
  // The rows since the previous evaluation count from the epoch's start, or from where a checkpoint had them.
  since_eval_loss_ = ExactSum{};
  since_eval_rows_ = 0;
  if (engine_.rank() == 0 && start.totals.contains("since_eval")) {
    const Totals since = Totals::from_json(start.totals["since_eval"], {});
    since_eval_loss_ = since.r.loss;
    since_eval_rows_ = since.r.count;
  }
  FANOUT_USER_CHECK(b0 % k == 0 || b0 == nb) << "cannot continue epoch " << epoch + 1 << " at batch " << b0
                                             << ": not the end of an optimizer step (of " << k << " batches)";
  const int64_t warm = std::min<int64_t>(cfg_.timing_warmup, nb - b0 - 1);
  auto t_warm = t0;
  double wait_at_warm = it.wait_seconds();
  // Every rank computes the same norms (of the reduced gradient): carried as they are.
  GradNorms norms;
  if (start.totals.contains("grad_norm")) {
    const nlohmann::json& g = start.totals["grad_norm"];
    FANOUT_USER_CHECK(g.is_object() && g.contains("sum") && g["sum"].is_number() && g.contains("max") &&
                      g["max"].is_number() && g.contains("steps") && g["steps"].is_number_integer())
        << "checkpoint: the epoch's gradient norms are malformed";
    norms = {g["sum"].get<double>(), g["max"].get<double>(), g["steps"].get<int64_t>()};
  }
  int64_t b = b0, group_rows = 0;
  // A stop after batch b: every rank's totals so far, the position saved (or
  // just checkpointed when !stop).
  auto mark = [&](bool stop) {
    Totals global = t;  // every rank's batches so far
    global.all_reduce(engine_);
    Place at{b, global.to_json(criterion.sum_names()), norms};
    if (b == nb) at.totals[kEpochDone] = true;
    const EpochPosition pos = position(at);
    if (on_mid_epoch) on_mid_epoch(epoch, pos, stop);
    if (!stop) return;
    progress_.end();
    set_stopped(epoch, pos);
  };
  // The evaluation a stop dropped after the checkpoint's last step runs first, at that step's rate.
  if (start.totals.contains(kEvalPending) && probe_loader_) {
    const nlohmann::json& p = start.totals[kEvalPending];
    FANOUT_USER_CHECK(p.is_object() && p.contains("lr") && p["lr"].is_number())
        << "checkpoint: the pending evaluation is malformed";
    pending_eval_lr_ = p["lr"].get<float>();
    if (!evaluate_during(epoch, *pending_eval_lr_)) {  // stopped again: the same position, as it came
      if (on_mid_epoch) on_mid_epoch(epoch, start, true);
      progress_.end();
      set_stopped(epoch, start);
      return m;
    }
    pending_eval_lr_.reset();
  }
  ExactSum step_loss;  // this optimizer step's rows, for on_step
  // (A run resumed after its last step, stopped in that epoch's evaluation, trains no batch.)
  while (!steps_done() && it.next(x, y)) {
    const int64_t group = b / k;
    if (b % k == 0) {
      group_rows = 0;
      for (int64_t i = b; i < std::min(nb, b + k); ++i) group_rows += rows_of(i);
    }
    const bool last_in_group = b % k == k - 1 || b == nb - 1;
    const float lr = rate(cfg_.schedule, epoch, steps_before + group, opt_steps, steps());
    m.lr = lr;
    const float grad_scale = loss_gradient_scale(scaler_.get()) / static_cast<float>(group_rows * world);
    // Random draws (Dropout) keyed by the position in the run, so a resumed run draws the same.
    // A re-batched rest keys its passes by their first sample, apart from batch indices.
    engine_.set_pass(static_cast<uint64_t>(epoch) << 32 |
                     (rebatched ? uint64_t{1} << 31 | static_cast<uint64_t>(first_sample + b * batch)
                                : static_cast<uint64_t>(b)));
    StepResult r = engine_.forward_backward(x, y, grad_scale, last_in_group);
    FANOUT_USER_CHECK(std::isfinite(r.loss_sum) || scaler_)  // with a scaler the step is skipped
        << "training diverged: loss is " << r.loss_sum << " at epoch " << epoch + 1 << " step " << b + 1
        << " (try a smaller learning rate)";
    if (b % k == 0) step_loss = ExactSum{};
    step_loss.merge(r.loss);
    if (last_in_group) optimizer_step(lr, epoch, b, norms, step_loss, group_rows);
    t.add(r);
    since_eval_loss_.merge(r.loss);
    since_eval_rows_ += r.count;
    run_rows_ += r.count;
    ++b;
    if (b - b0 == warm) {
      t_warm = std::chrono::steady_clock::now();
      wait_at_warm = it.wait_seconds();
    }
    // The criterion's first metric, as the epoch's summary shows it, once this pass scores it.
    if (!metrics.empty() && t.denominator(metrics[0]) != 0)
      progress_.update(b, t.r.count, t.mean_trained_loss(), metrics[0].summary.c_str(),
                       t.ratio(metrics[0]) * metrics[0].scale);
    else
      progress_.update(b, t.r.count, t.mean_trained_loss(), nullptr, 0);
    bool dropped = false;  // a stop came in this step's evaluation: the run stops after the step
    if (last_in_group && probe_loader_ && steps() % cfg_.eval_every == 0) {
      try {
        dropped = !evaluate_during(epoch, lr);
      } catch (...) {
        save_before_error(epoch, Place{b, t.to_json(criterion.sum_names()), norms});  // one process: t is global
        throw;
      }
      if (dropped) pending_eval_lr_ = lr;
    }
    // (Dropped after the epoch's last batch: the position is the epoch after it, evaluated on resume.)
    if (last_in_group && (b < nb || dropped)) {
      const int64_t n = steps();
      const bool save = b < nb && cfg_.save_every_steps > 0 && n % cfg_.save_every_steps == 0;
      const bool stop = dropped || stop_agreed(n % kStopCheckSteps == 0);
      if (save || stop) mark(stop);
      if (stop) return m;
    }
    // --max-steps: the epoch ends at the run's last step (every rank counts the same steps).
    if (last_in_group && steps_done()) break;
  }
  progress_.end();
  t.all_reduce(engine_);
  epoch_end_ = {b, t.to_json(criterion.sum_names()), norms};
  if (b == nb) epoch_end_.totals[kEpochDone] = true;
  if (b == b0 && b0 > 0)  // no batch trained here (resumed after the last): the rate of the step before
    m.lr = rate(cfg_.schedule, epoch, steps_before + (b0 - 1) / k, opt_steps, std::max<int64_t>(0, steps() - 1));
  const auto t1 = std::chrono::steady_clock::now();
  m.epoch_seconds = std::chrono::duration<double>(t1 - t0).count();
  // Evaluations inside the epoch are not training time.
  const double steady =
      std::max(0.0, std::chrono::duration<double>(t1 - t_warm).count() - (eval_seconds_ - eval_seconds_before));
  const int64_t here = b - b0;  // batches this call trained
  // Without the evaluations inside the epoch; the whole epoch's time when no step came after the warm-up
  // (--max-steps ended it there).
  const double evals = eval_seconds_ - eval_seconds_before;
  m.steady_epoch_seconds = warm > 0 && here > warm
                               ? steady * static_cast<double>(here) / static_cast<double>(here - warm)
                               : warm > 0 ? std::max(0.0, m.epoch_seconds - evals)
                                          : steady;
  m.train_loss = t.mean_trained_loss();
  m.loss_format = criterion.loss_format();
  score(m.metrics, metrics, t, /*test=*/false);
  m.images_per_second = m.steady_epoch_seconds > 0 ? (t.r.count - carried) / m.steady_epoch_seconds : 0;
  m.tokens_per_sample = tokens_per_sample_;
  m.grad_norms = cfg_.clip_grad_norm > 0 && (norms.steps > 0 || b > b0);  // nothing to say of an epoch not trained here
  const double unmeasured = m.grad_norms ? std::nan("") : 0.0;  // clipping on, every step skipped
  m.grad_norm_mean = norms.steps > 0 ? norms.sum / static_cast<double>(norms.steps) : unmeasured;
  m.grad_norm_max = norms.steps > 0 ? norms.max : unmeasured;
  if (scaler_) {
    m.loss_scaling = true;
    m.loss_scale = scaler_->scale();
    m.skipped_steps = scaler_->skipped();
  }
  m.data_wait_fraction = steady > 0 ? std::min(1.0, (it.wait_seconds() - wait_at_warm) / steady) : 0;
  return m;
}

namespace {
// Every row of `it` through engine.eval_step, summed over every process
// into t; false (t incomplete) when stop(i) says so after batch i (stop(-1)
// comes first).
bool eval_pass(Engine& engine, data::DataLoader& it, int64_t train_batch, const std::function<bool(int64_t)>& stop,
               Totals& t, const std::function<void(int64_t, const Totals&)>& each = {}) {
  engine.prepare_eval();
  it.start_epoch(0);
  Tensor x, y;
  t = Totals{};
  // In pieces of at most the training batch of this process: evaluation
  // reuses the buffers training sized, so it needs no memory (and makes no
  // allocation) beyond training's. Rows are independent in eval mode and
  // the sums exact, so the pieces change no result.
  const int64_t piece = std::max<int64_t>(1, train_batch / engine.world_size());
  stop(-1);  // on every rank before the first batch, whatever its share
  for (int64_t i = 0; it.next(x, y); ++i) {
    for (int64_t b = 0; b < x.size(0); b += piece) {
      const int64_t e = std::min(x.size(0), b + piece);
      t.add(engine.eval_step(x.slice(b, e), y.slice(b, e)));
    }
    if (each) each(i, t);
    if (stop(i)) return false;
  }
  t.all_reduce(engine);
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double Trainer::seconds_in_run() const { return seconds_since(run_start_) - eval_seconds_; }

EpochPosition Trainer::position(const Place& at) {
  EpochPosition pos{at.batch, at.totals};
  const GradNorms& norms = at.norms;
  if (norms.steps > 0) pos.totals["grad_norm"] = {{"sum", norms.sum}, {"max", norms.max}, {"steps", norms.steps}};
  if (probe_loader_) pos.totals["since_eval"] = rows_since_eval(engine_, since_eval_loss_, since_eval_rows_).to_json({});
  if (pending_eval_lr_) pos.totals[kEvalPending] = {{"lr", *pending_eval_lr_}};
  return pos;
}

void Trainer::save_before_error(int epoch, const Place& at) {
  // One process only: under DDP the other ranks may be inside a collective.
  if (engine_.world_size() != 1 || !on_mid_epoch) return;
  try {
    on_mid_epoch(epoch, position(at), /*stopping=*/false);
  } catch (const std::exception& e) {  // the first error is the one to report
    std::fprintf(stderr, "fanout: could not save the training before the error below: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "fanout: could not save the training before the error below\n");
  }
}

bool Trainer::stop_evaluating(int64_t i, const data::DataLoader& it) {
  const auto& poll = should_stop_evaluating;
  if (!poll) return false;  // every rank alike: no check, and no collective for one
  if (engine_.world_size() == 1) return i >= 0 && i + 1 < it.num_batches() && poll();  // none after the last
  // The ranks check together every kStopCheckSteps batches of the shortest
  // share (a rank may hold a row fewer, so a batch fewer).
  if (i < 0) {
    std::vector<int64_t> v(static_cast<size_t>(engine_.world_size()), 0);
    v[static_cast<size_t>(engine_.rank())] = it.num_batches();
    engine_.all_reduce_stats(v, "evaluation batches");
    eval_common_batches_ = *std::min_element(v.begin(), v.end());
    return false;
  }
  if ((i + 1) % kStopCheckSteps != 0 || i + 1 >= eval_common_batches_) return false;
  std::vector<int64_t> v{poll() ? 1 : 0};
  engine_.all_reduce_stats(v, "the stop check in evaluation");
  return v[0] > 0;
}

bool Trainer::evaluate_during(int epoch, float lr) {
  const auto t0 = std::chrono::steady_clock::now();
  const double trained = seconds_in_run();
  const Totals since = rows_since_eval(engine_, since_eval_loss_, since_eval_rows_);
  std::vector<int64_t> rows{run_rows_};
  engine_.all_reduce_stats(rows, "rows trained");
  Totals v;
  if (!eval_pass(engine_, *probe_loader_, cfg_.batch_size, [&](int64_t i) { return stop_evaluating(i, *probe_loader_); },
                 v)) {
    eval_seconds_ += seconds_since(t0);  // dropped: the run stops after this step
    return false;
  }
  EvalMetrics e;
  e.epoch = epoch + 1;
  e.step = steps();
  e.train_loss = since.mean_trained_loss();
  e.val_loss = v.mean_loss();
  e.val_rows = v.r.count;
  score(e.metrics, checked_metrics(engine_.criterion()), v, /*test=*/true);
  e.loss_format = engine_.criterion().loss_format();
  e.tokens_per_sample = tokens_per_sample_;
  const double dt = trained - seconds_at_eval_;
  e.rows_per_second = dt > 0 ? static_cast<double>(rows[0] - rows_at_eval_) / dt : 0;
  e.elapsed_seconds = trained;
  e.lr = lr;
  seconds_at_eval_ = trained;
  rows_at_eval_ = rows[0];
  since_eval_loss_ = ExactSum{};
  since_eval_rows_ = 0;
  if (cfg_.summary_out) {
    progress_.clear();
    std::fprintf(cfg_.summary_out, "%s\n", eval_line(e, cfg_.max_steps).c_str());
    std::fflush(cfg_.summary_out);
  }
  if (on_eval) on_eval(e);  // best.safetensors first: a metrics error must not lose it
  write_metrics(eval_json(e));
  eval_seconds_ += seconds_since(t0);
  return true;
}

bool Trainer::evaluate(EpochMetrics& m) {
  Totals t;
  // A long evaluation (a large validation split) shows its progress once it has taken a few seconds.
  const auto t0 = std::chrono::steady_clock::now();
  bool shown = false;
  const auto each = [&](int64_t i, const Totals& so_far) {
    if (!shown && seconds_since(t0) < 3.0) return;
    if (!shown)
      progress_.begin("epoch " + std::to_string(m.epoch) + "/" + std::to_string(cfg_.epochs) + " evaluation",
                      test_loader_->num_batches(), test_loader_->num_samples(), tokens_per_sample_, t0);
    shown = true;
    progress_.update(i + 1, so_far.r.count, so_far.r.count ? so_far.r.loss.value() / so_far.r.count : 0, nullptr, 0);
  };
  const bool done = eval_pass(engine_, *test_loader_, cfg_.batch_size,
                              [&](int64_t i) { return stop_evaluating(i, *test_loader_); }, t, each);
  if (shown) progress_.end();
  if (!done) return false;
  m.test_loss = t.mean_loss();
  score(m.metrics, checked_metrics(engine_.criterion()), t, /*test=*/true);
  return true;
}

namespace {
// Each replica's model and optimizer bytes in this process (activations: 0).
std::vector<ReplicaMemory> model_memory(Engine& engine, const optim::Optimizer& opt) {
  const std::vector<ReplicaArenas> arenas = replica_arenas(engine);
  const std::vector<int64_t> state = opt.state_bytes();
  std::vector<ReplicaMemory> out(arenas.size());
  for (size_t i = 0; i < arenas.size(); ++i)
    out[i] = {arenas[i].params, arenas[i].grads, arenas[i].buffers, i < state.size() ? state[i] : 0, 0};
  return out;
}
int64_t model_bytes(const ReplicaMemory& r) { return r.params + r.grads + r.buffers + r.optimizer_state; }
// The model bytes of every replica on replica i's device (a GPU repeated in
// the device list holds several), and how many replicas those are.
std::pair<int64_t, int64_t> device_models(const std::vector<Device>& devices, const std::vector<ReplicaMemory>& model,
                                          size_t i) {
  int64_t bytes = 0, count = 0;
  for (size_t j = 0; j < devices.size() && j < model.size(); ++j)
    if (devices[j] == devices[i]) bytes += model_bytes(model[j]), ++count;
  return {bytes, count};
}
constexpr size_t kMemoryKinds = 5;
}  // namespace

void Trainer::start_memory() {
  const std::vector<Device> devices = engine_.devices();
  const std::vector<ReplicaMemory> model = model_memory(engine_, opt_);
  for (const Device& d : devices) reset_device_peak_bytes(d);  // the mark restarts from what is held now
  held_before_.assign(devices.size(), 0);
  for (size_t i = 0; i < devices.size() && i < model.size(); ++i)
    held_before_[i] =
        std::max<int64_t>(0, static_cast<int64_t>(device_peak_bytes(devices[i])) - device_models(devices, model, i).first);
}

void Trainer::measure_memory(EpochMetrics& m) {
  const std::vector<Device> devices = engine_.devices();
  const int world = engine_.world_size(), rank = engine_.rank();
  const size_t n = devices[0].is_cuda() ? devices.size() : 0;
  const size_t replicas = devices[0].is_cpu() ? devices.size() : 0;
  const size_t all = devices.size() * static_cast<size_t>(world);
  // Every rank has as many devices (the list is split evenly): one slot each, summed = gathered.
  std::vector<int64_t> v(1 + (n + replicas) * static_cast<size_t>(world) + kMemoryKinds * all, 0);
  v[0] = static_cast<int64_t>(peak_host_bytes());
  for (size_t i = 0; i < n; ++i) v[1 + rank * n + i] = static_cast<int64_t>(device_peak_bytes(devices[i]));
  const std::vector<ReplicaMemory> model = model_memory(engine_, opt_);
  for (size_t i = 0; i < replicas && i < model.size(); ++i) v[1 + rank * replicas + i] = model_bytes(model[i]);
  const size_t kinds = 1 + (n + replicas) * static_cast<size_t>(world);
  for (size_t i = 0; i < devices.size() && i < model.size(); ++i) {
    // Replicas sharing a device (a repeated GPU) share its activations evenly.
    const int64_t peak = static_cast<int64_t>(device_peak_bytes(devices[i]));
    const int64_t before = i < held_before_.size() ? held_before_[i] : 0;
    const auto [models, sharing] = device_models(devices, model, i);
    const ReplicaMemory& r = model[i];
    const int64_t row[kMemoryKinds] = {r.params, r.grads, r.buffers, r.optimizer_state,
                                       std::max<int64_t>(0, peak - before - models) / sharing};
    std::copy(row, row + kMemoryKinds, v.begin() + static_cast<int64_t>(kinds + kMemoryKinds * (rank * devices.size() + i)));
  }
  // The last slot: bad samples replaced by either split's dataset (-1 from both: not counted).
  const int64_t skipped_train = train_set_->skipped_samples(), skipped_test = test_set_->skipped_samples();
  const bool counted = skipped_train >= 0 || skipped_test >= 0;
  v.push_back(std::max<int64_t>(skipped_train, 0) + std::max<int64_t>(skipped_test, 0));
  engine_.all_reduce_stats(v, "peak memory");
  m.skipped_samples = counted ? v.back() : -1;
  v.pop_back();
  m.peak_host_bytes = v[0];
  m.peak_device_bytes.assign(v.begin() + 1, v.begin() + 1 + static_cast<int64_t>(n * world));
  m.replica_bytes.assign(v.begin() + 1 + static_cast<int64_t>(n * world), v.begin() + static_cast<int64_t>(kinds));
  m.replica_memory.clear();
  for (size_t k = kinds; k + kMemoryKinds <= v.size(); k += kMemoryKinds)
    m.replica_memory.push_back({v[k], v[k + 1], v[k + 2], v[k + 3], v[k + 4]});
}

namespace {
std::string format_value(const char* format, double v) {
  char s[128];
  std::snprintf(s, sizeof s, format, v);  // checked by valid_value_format: one floating conversion
  return s;
}

std::string gib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(bytes) / 1073741824.0);
  return s;
}
}  // namespace

std::string summary_line(const EpochMetrics& m, int epochs) {
  char head[160], tail[160];
  std::snprintf(head, sizeof head, "epoch %d/%d  ", m.epoch, epochs);
  auto scores = [&](const char* split, double loss, bool test) {
    std::string s = std::string(split) + " loss " + format_value(m.loss_format.c_str(), loss);
    for (const EpochMetrics::Metric& x : m.metrics)
      if (x.scored) s.append(" ").append(format_value(x.spec.summary.c_str(), (test ? x.test : x.train) * x.spec.scale));
    return s;
  };
  const bool tokens = m.tokens_per_sample > 0;
  std::snprintf(tail, sizeof tail, "%s  %.1f s  %.0f %s  data wait %.1f%%  lr %.4g  ",
                tokens ? format_value(" ppl %.2f", std::exp(m.test_loss)).c_str() : "", m.epoch_seconds,
                m.images_per_second * (tokens ? static_cast<double>(m.tokens_per_sample) : 1.0),
                tokens ? "tokens/s" : "img/s", 100 * m.data_wait_fraction, m.lr);
  char norms[96] = "";
  if (m.grad_norms && std::isnan(m.grad_norm_mean))
    std::snprintf(norms, sizeof norms, "grad norm - (every step skipped)  ");
  else if (m.grad_norms)
    std::snprintf(norms, sizeof norms, "grad norm %.3g (max %.3g)  ", m.grad_norm_mean, m.grad_norm_max);
  char scaling[96] = "";
  if (m.loss_scaling)
    std::snprintf(scaling, sizeof scaling, "loss scale %.6g (%lld step%s skipped)  ", m.loss_scale,
                  static_cast<long long>(m.skipped_steps), m.skipped_steps == 1 ? "" : "s");
  char bad[64] = "";
  if (m.skipped_samples > 0)
    std::snprintf(bad, sizeof bad, "%lld bad sample%s skipped  ", static_cast<long long>(m.skipped_samples),
                  m.skipped_samples == 1 ? "" : "s");
  return std::string(head) + scores("train", m.train_loss, false) + "  " + scores("test", m.test_loss, true) + tail +
         norms + scaling + bad + memory_summary(m);
}

std::string eval_line(const EvalMetrics& m, int64_t max_steps) {
  std::string s = "step " + std::to_string(m.step) + (max_steps > 0 ? "/" + std::to_string(max_steps) : "") +
                  "  train loss " + format_value(m.loss_format.c_str(), m.train_loss) + "  val loss " +
                  format_value(m.loss_format.c_str(), m.val_loss);
  const bool tokens = m.tokens_per_sample > 0;
  if (tokens) s += format_value(" ppl %.2f", std::exp(m.val_loss));
  for (const EpochMetrics::Metric& x : m.metrics)
    if (x.scored) s.append(" ").append(format_value(x.spec.summary.c_str(), x.test * x.spec.scale));
  char tail[128];
  std::snprintf(tail, sizeof tail, "  %.0f %s  lr %.4g  %s", m.rows_per_second * (tokens ? m.tokens_per_sample : 1),
                tokens ? "tokens/s" : "img/s", m.lr, format_duration(m.elapsed_seconds).c_str());
  return s + tail;
}

std::string final_line(const EpochMetrics& m) {
  std::string s = "final test";
  bool any = false;
  for (const EpochMetrics::Metric& x : m.metrics)
    if (x.scored) {
      s.append(" ").append(format_value(x.spec.final.c_str(), x.test * x.spec.scale));
      any = true;
    }
  return any ? s : s + " loss " + format_value(m.loss_format.c_str(), m.test_loss);
}

std::string memory_summary(const EpochMetrics& m) {
  std::string s = "peak memory " + gib(m.peak_host_bytes) + " GiB host";
  for (size_t i = 0; i < m.peak_device_bytes.size(); ++i)
    s += (i == 0 ? ", GPUs " : " / ") + gib(m.peak_device_bytes[i]);
  if (!m.peak_device_bytes.empty()) s += " GiB";
  if (m.replica_bytes.size() > 1) {  // the balance between CPU replicas (sharding shows here)
    char mib[32];
    for (size_t i = 0; i < m.replica_bytes.size(); ++i) {
      std::snprintf(mib, sizeof mib, "%.1f", static_cast<double>(m.replica_bytes[i]) / 1048576.0);
      s += (i == 0 ? "; replicas " : " / ") + std::string(mib);
    }
    s += " MiB";
  }
  return s;
}

void Trainer::write_metrics(const nlohmann::json& j) {
  if (cfg_.metrics_path.empty()) return;
  io::detail::Fd fd(::open(cfg_.metrics_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
  FANOUT_USER_CHECK(fd.fd >= 0) << "cannot open metrics file " << cfg_.metrics_path << ": " << std::strerror(errno);
  struct stat st{};
  const off_t before = ::fstat(fd.fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
  const std::string line = j.dump() + "\n";
  // In the file whole, or the error known before this returns: a line cut short (a full disk) is taken back.
  size_t done = 0;
  if (const int err = io::detail::write_all(fd.fd, line.data(), line.size(), &done)) {
    const bool cut = done > 0 && before >= 0 && ::ftruncate(fd.fd, before) != 0;  // a resume removes it then
    FANOUT_FAIL() << "cannot write metrics file " << cfg_.metrics_path << ": " << std::strerror(err)
                  << (cut ? " (its last line is cut short)" : "");
  }
  FANOUT_USER_CHECK(::close(fd.release()) == 0)
      << "cannot write metrics file " << cfg_.metrics_path << ": " << std::strerror(errno);
}

EpochMetrics Trainer::run(int first_epoch, int last_epoch, const EpochPosition& start) {
  if (last_epoch < 0) last_epoch = cfg_.epochs;
  FANOUT_USER_CHECK(first_epoch >= 0 && first_epoch <= last_epoch && last_epoch <= cfg_.epochs)
      << "epochs to run [" << first_epoch << ", " << last_epoch << ") are outside the run's " << cfg_.epochs;
  EpochMetrics m;
  stopped_ = false;
  run_start_ = std::chrono::steady_clock::now();
  eval_seconds_ = seconds_at_eval_ = 0;
  run_rows_ = rows_at_eval_ = 0;
  pending_eval_lr_.reset();
  // A run that took its last step but stopped in the evaluation after it resumes there (start.batch > 0).
  FANOUT_USER_CHECK(!steps_done() || (start.batch > 0 && steps() == cfg_.max_steps))
      << "the run has taken its " << cfg_.max_steps << " steps (--max-steps) already";
  start_memory();
  for (int e = first_epoch; e < last_epoch; ++e) {
    m = train_epoch(e, e == first_epoch ? start : EpochPosition{});
    if (stopped_) return m;
    const auto te = std::chrono::steady_clock::now();
    bool evaluated = false;
    try {
      evaluated = evaluate(m);
    } catch (...) {
      save_before_error(e, epoch_end_);
      throw;
    }
    if (!evaluated) {
      // Stopped while evaluating: the checkpoint is the epoch after its last
      // batch, so a resumed run evaluates it first.
      set_stopped(e, position(epoch_end_));
      if (on_mid_epoch) on_mid_epoch(e, stopped_at_, true);
      return m;
    }
    measure_memory(m);
    if (cfg_.summary_out) std::fprintf(cfg_.summary_out, "%s\n", summary_line(m, cfg_.epochs).c_str());
    if (cfg_.summary_out) std::fflush(cfg_.summary_out);
    if (on_epoch_end) on_epoch_end(m);  // the checkpoint first: a metrics error must not lose it
    write_metrics(metrics_json(m));
    eval_seconds_ += seconds_since(te);
    if (steps_done()) return m;
    if (e + 1 < last_epoch && stop_agreed(true)) {
      set_stopped(e + 1, EpochPosition{});
      return m;
    }
  }
  return m;
}

}  // namespace fanout::train
