// Training loop.
#include "runtime/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/io/safetensors.h"

namespace fanout::train {

Trainer::Trainer(const TrainerConfig& cfg, Engine& engine, const data::TrainTest& data)
    : cfg_(cfg), engine_(engine), data_(data), progress_(cfg.progress) {
  FANOUT_USER_CHECK(cfg.batch_size > 0) << "batch size must be positive, got " << cfg.batch_size;
  FANOUT_USER_CHECK(cfg.epochs > 0) << "epochs must be positive, got " << cfg.epochs;
  FANOUT_USER_CHECK(data.train.size() > 0) << "the training set is empty";
  data::LoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.workers = cfg.workers;
  lo.prefetch = cfg.prefetch;
  lo.drop_last = cfg.drop_last;
  lo.pin_memory = cfg.pin_memory;
  lo.augment = cfg.augment;
  lo.seed = cfg.seed;
  train_loader_ = std::make_unique<data::DataLoader>(
      data.train, std::make_unique<data::RandomSampler>(data.train.size(), cfg.seed), lo);
  data::LoaderOptions eo = lo;
  eo.batch_size = cfg.eval_batch_size;
  eo.drop_last = false;
  eo.augment = {};
  test_loader_ = std::make_unique<data::DataLoader>(
      data.test, std::make_unique<data::SequentialSampler>(data.test.size()), eo);
}

nlohmann::json metrics_json(const EpochMetrics& m) {
  return {{"epoch", m.epoch},
          {"train_loss", m.train_loss},
          {"train_acc", m.train_acc},
          {"test_loss", m.test_loss},
          {"test_acc", m.test_acc},
          {"epoch_seconds", m.epoch_seconds},
          {"images_per_second", m.images_per_second},
          {"data_wait_fraction", m.data_wait_fraction},
          {"lr", m.lr}};
}

int drop_metrics_after(const std::string& path, int last_epoch) {
  std::ifstream in(path);
  if (!in.is_open()) return 0;
  std::string kept, line;
  int dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("epoch") && j["epoch"].is_number_integer() && j["epoch"].get<int64_t>() > last_epoch) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  FANOUT_USER_CHECK(in.eof()) << "cannot read metrics file " << path;
  if (dropped > 0) io::write_file_atomic(path, [&](const io::WriteFn& write) { write(kept.data(), kept.size()); });
  return dropped;
}

EpochMetrics Trainer::train_epoch(int epoch) {
  EpochMetrics m;
  m.epoch = epoch + 1;
  data::DataLoader& it = *train_loader_;
  it.start_epoch(epoch);
  const int64_t nb = it.num_batches();
  const int64_t total = it.num_samples();
  Tensor x, y;
  progress_.begin("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(cfg_.epochs), nb, total);
  const auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  int64_t correct = 0, count = 0, step = 0;
  while (it.next(x, y)) {
    const float lr = cfg_.schedule.at(epoch, static_cast<int>(step), static_cast<int>(nb));
    m.lr = lr;
    StepResult r = engine_.train_step(x, y, lr);
    FANOUT_USER_CHECK(std::isfinite(r.loss_sum))
        << "training diverged: loss is " << r.loss_sum << " at epoch " << epoch + 1 << " step " << step + 1
        << " (try a smaller --lr)";
    loss_sum += r.loss_sum;
    correct += r.correct;
    count += r.count;
    ++step;
    progress_.update(step, count, loss_sum / count, static_cast<double>(correct) / count);
  }
  progress_.end();
  m.epoch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.train_loss = count ? loss_sum / count : 0;
  m.train_acc = count ? static_cast<double>(correct) / count : 0;
  m.images_per_second = m.epoch_seconds > 0 ? count / m.epoch_seconds : 0;
  m.data_wait_fraction = m.epoch_seconds > 0 ? std::min(1.0, it.wait_seconds() / m.epoch_seconds) : 0;
  return m;
}

void Trainer::evaluate(EpochMetrics& m) {
  data::DataLoader& it = *test_loader_;
  it.start_epoch(0);
  Tensor x, y;
  double loss_sum = 0;
  int64_t correct = 0, count = 0;
  while (it.next(x, y)) {
    StepResult r = engine_.eval_step(x, y);
    loss_sum += r.loss_sum;
    correct += r.correct;
    count += r.count;
  }
  m.test_loss = count ? loss_sum / count : 0;
  m.test_acc = count ? static_cast<double>(correct) / count : 0;
}

void Trainer::write_metrics(const EpochMetrics& m) {
  if (cfg_.metrics_path.empty()) return;
  const nlohmann::json j = metrics_json(m);
  std::ofstream f(cfg_.metrics_path, std::ios::app);
  FANOUT_USER_CHECK(f.good()) << "cannot open metrics file " << cfg_.metrics_path;
  f << j.dump() << "\n";
  FANOUT_USER_CHECK(f.good()) << "cannot write metrics file " << cfg_.metrics_path;
}

EpochMetrics Trainer::run(int first_epoch, int last_epoch) {
  if (last_epoch < 0) last_epoch = cfg_.epochs;
  FANOUT_USER_CHECK(first_epoch >= 0 && first_epoch <= last_epoch && last_epoch <= cfg_.epochs)
      << "epochs to run [" << first_epoch << ", " << last_epoch << ") are outside the run's " << cfg_.epochs;
  EpochMetrics m;
  for (int e = first_epoch; e < last_epoch; ++e) {
    m = train_epoch(e);
    evaluate(m);
    std::fprintf(cfg_.summary_out,
                 "epoch %d/%d  train loss %.4f acc %.4f  test loss %.4f acc %.4f  %.1f s  %.0f img/s  data wait %.1f%%  lr %.4g\n",
                 m.epoch, cfg_.epochs, m.train_loss, m.train_acc, m.test_loss, m.test_acc, m.epoch_seconds,
                 m.images_per_second, 100 * m.data_wait_fraction, m.lr);
    std::fflush(cfg_.summary_out);
    write_metrics(m);
    if (on_epoch_end) on_epoch_end(m);
  }
  return m;
}

}  // namespace fanout::train
