// Per-epoch progress: a redrawn bar with rate, ETA and running loss on a
// terminal; a plain line every tenth of the epoch otherwise.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace fanout::train {

class Progress {
 public:
  enum class Mode { Auto, Bar, Lines, Off };
  Progress(Mode mode, FILE* out = stderr);
  // The rate counts samples ("img/s"), or tokens when each sample holds
  // `tokens_per_sample` of them ("tokens/s").
  // `started`: when the work began (its rate counts from there), if before now.
  void begin(const std::string& label, int64_t total_batches, int64_t total_images, int64_t tokens_per_sample = 0,
             std::optional<std::chrono::steady_clock::time_point> started = std::nullopt);
  // The running metric is shown by `metric_format`, a printf format with
  // one floating conversion (the criterion's first metric: "acc %.4f" for
  // classifiers, "loc err %.2f" for heatmaps); none when null.
  void update(int64_t batches_done, int64_t images_done, double running_loss, const char* metric_format,
              double metric);
  void end();
  // Takes a drawn bar off the terminal so that a line can be printed; the
  // next update draws it again.
  void clear();

 private:
  Mode mode_;
  FILE* out_;
  std::string label_;
  int64_t total_batches_ = 0, total_images_ = 0, tokens_per_sample_ = 0;
  int64_t next_line_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"

}  // namespace fanout::train
