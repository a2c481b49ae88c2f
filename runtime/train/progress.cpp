// Progress reporting.
#include "runtime/train/progress.h"

#include <unistd.h>

#include <cmath>

namespace fanout::train {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

Progress::Progress(Mode mode, FILE* out) : mode_(mode), out_(out) {
  if (mode_ == Mode::Auto) mode_ = isatty(fileno(out)) ? Mode::Bar : Mode::Lines;
}

void Progress::begin(const std::string& label, int64_t total_batches, int64_t total_images,
                     int64_t tokens_per_sample, std::optional<std::chrono::steady_clock::time_point> started) {
  label_ = label;
  tokens_per_sample_ = tokens_per_sample;
  total_batches_ = total_batches;
  total_images_ = total_images;
  next_line_ = 1;
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (started) start_ = *started;
  drawn_ = false;
}

namespace {
std::string metric_text(const char* format, double v) {
  if (!format) return "";
  char buf[128] = "  ";
  std::snprintf(buf + 2, sizeof buf - 2, format, v);  // the Trainer checked it: one floating conversion
  return buf;
}
}  // namespace

void Progress::update(int64_t batches, int64_t images, double loss, const char* metric_format, double metric) {
  if (mode_ == Mode::Off || total_batches_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? images / elapsed : 0;
  const double eta = rate > 0 ? (total_images_ - images) / rate : 0;
  const double shown_rate = tokens_per_sample_ > 0 ? rate * static_cast<double>(tokens_per_sample_) : rate;
  const char* unit = tokens_per_sample_ > 0 ? "tokens/s" : "img/s";
  if (mode_ == Mode::Bar) {
    if (batches != total_batches_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    last_draw_ = now;
    const int width = 28;
    const int filled = static_cast<int>(width * batches / total_batches_);
    std::string bar(filled, '#');
    bar += std::string(width - filled, '.');
    std::fprintf(out_, "\r%s [%s] %3d%% %lld/%lld  %.0f %s  ETA %s  loss %.4f%s\033[K", label_.c_str(),
                 bar.c_str(), static_cast<int>(100 * batches / total_batches_), static_cast<long long>(batches),
                 static_cast<long long>(total_batches_), shown_rate, unit, format_duration(eta).c_str(), loss,
                 metric_text(metric_format, metric).c_str());
    std::fflush(out_);
    drawn_ = true;
    return;
  }
  // Lines: one each time another tenth of the epoch is done.
  if (batches * 10 < next_line_ * total_batches_) return;
  while (batches * 10 >= next_line_ * total_batches_) ++next_line_;
  std::fprintf(out_, "%s %3d%% %lld/%lld batches  %.0f %s  ETA %s  loss %.4f%s\n", label_.c_str(),
               static_cast<int>(100 * batches / total_batches_), static_cast<long long>(batches),
               static_cast<long long>(total_batches_), shown_rate, unit, format_duration(eta).c_str(), loss,
               metric_text(metric_format, metric).c_str());
  std::fflush(out_);
}

void Progress::end() { clear(); }

void Progress::clear() {
  if (mode_ == Mode::Bar && drawn_) {
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
    drawn_ = false;
    last_draw_ = start_;  // the next update redraws at once
  }
}

}  // namespace fanout::train
