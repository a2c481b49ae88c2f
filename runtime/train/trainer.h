// The training loop: epochs of shuffled batches through an Engine, the
// learning-rate schedule, evaluation on the test split, a summary line per
// epoch and an optional JSON-lines metrics file.
#pragma once
#include <functional>
#include <string>

#include "runtime/data/dataset.h"
#include "runtime/optim/lr_schedule.h"
#include "runtime/parallel/engine.h"
#include "runtime/train/progress.h"

namespace fanout::train {

struct TrainerConfig {
  int epochs = 1;
  int64_t batch_size = 64;
  int64_t eval_batch_size = 1000;
  uint64_t seed = 0;
  bool drop_last = false;
  optim::LrSchedule schedule;
  std::string metrics_path;  // empty: none
  Progress::Mode progress = Progress::Mode::Auto;
  FILE* summary_out = stdout;
};

struct EpochMetrics {
  int epoch = 0;  // 1-based
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  double epoch_seconds = 0, images_per_second = 0;
  double lr = 0;
};

class Trainer {
 public:
  Trainer(const TrainerConfig& cfg, Engine& engine, const data::TrainTest& data);
  // Trains epochs [first_epoch, cfg.epochs); returns the last epoch's metrics.
  EpochMetrics run(int first_epoch = 0);
  EpochMetrics train_epoch(int epoch);  // 0-based epoch; fills train fields
  void evaluate(EpochMetrics& m);       // fills test fields
  // Called after each epoch (checkpointing hooks in here).
  std::function<void(const EpochMetrics&)> on_epoch_end;

 private:
  void write_metrics(const EpochMetrics& m);
  TrainerConfig cfg_;
  Engine& engine_;
  const data::TrainTest& data_;
  Progress progress_;
  Tensor x_, y_;
};

}  // namespace fanout::train
