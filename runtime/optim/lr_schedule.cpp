// Learning-rate schedules.
#include "runtime/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "runtime/core/error.h"

namespace fanout::optim {

float LrSchedule::at_run_step(int64_t step) const {
  const double it = static_cast<double>(step);
  if (it < warmup_steps) return static_cast<float>(base_lr * (it + 1) / (warmup_steps + 1));
  if (it > lr_decay_steps) return min_lr;
  const double ratio = (it - warmup_steps) / (lr_decay_steps - warmup_steps);
  return static_cast<float>(min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (base_lr - min_lr));
}

float LrSchedule::at(int epoch, int step, int steps_per_epoch) const {
  if (kind == Kind::WarmupCosine) return at_run_step(int64_t{epoch} * steps_per_epoch + step);
  double lr = base_lr;
  switch (kind) {
    case Kind::Constant: break;
    case Kind::Step: lr = base_lr * std::pow(gamma, epoch / std::max(1, step_size)); break;
    case Kind::MultiStep: {
      const auto passed = std::upper_bound(milestones.begin(), milestones.end(), epoch) - milestones.begin();
      lr = base_lr * std::pow(gamma, static_cast<double>(passed));
      break;
    }
    case Kind::WarmupCosine: break;  // above
    case Kind::Cosine: {
      const double t = std::min(epoch, std::max(1, total_epochs));
      lr = eta_min + (base_lr - eta_min) * (1 + std::cos(M_PI * t / std::max(1, total_epochs))) / 2;
      break;
    }
  }
  if (warmup_epochs > 0) {
    const double it = static_cast<double>(epoch) * steps_per_epoch + step + 1;
    const double warm = static_cast<double>(warmup_epochs) * steps_per_epoch;
    if (it < warm) lr *= it / warm;
  }
  return static_cast<float>(lr);
}

namespace {
std::vector<std::string> split(const std::string& s, char c) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, c)) out.push_back(item);
  return out;
}
bool to_int(const std::string& s, int& v) {
  try {
    size_t n = 0;
    v = std::stoi(s, &n);
    return n == s.size();
  } catch (...) { return false; }
}
bool to_float(const std::string& s, float& v) {
  try {
    size_t n = 0;
    v = std::stof(s, &n);
    return n == s.size() && std::isfinite(v);
  } catch (...) { return false; }
}
}  // namespace

LrSchedule parse_lr_schedule(const std::string& spec, float base_lr, int total_epochs, float warmup_epochs) {
  LrSchedule s;
  s.base_lr = base_lr;
  s.total_epochs = total_epochs;
  s.warmup_epochs = warmup_epochs;
  FANOUT_USER_CHECK(warmup_epochs >= 0) << "warm-up epochs must be non-negative, got " << warmup_epochs;
  const auto parts = split(spec, ':');
  const std::string kind = parts.empty() ? "" : parts[0];
  const std::string usage =
      " (expected constant, step[:STEP_SIZE[:GAMMA]], multistep:M1,M2,...[:GAMMA], cosine or warmup-cosine)";
  if (kind == "constant" && parts.size() == 1) {
    s.kind = LrSchedule::Kind::Constant;
  } else if (kind == "cosine" && parts.size() == 1) {
    s.kind = LrSchedule::Kind::Cosine;
  } else if (kind == "warmup-cosine" && parts.size() == 1) {
    FANOUT_USER_CHECK(warmup_epochs == 0) << "warmup-cosine warms up by steps (--warmup-steps), not --warmup-epochs";
    s.kind = LrSchedule::Kind::WarmupCosine;
  } else if (kind == "step" && parts.size() <= 3) {
    s.kind = LrSchedule::Kind::Step;
    s.step_size = std::max(1, total_epochs / 3);
    if (parts.size() >= 2) {
      FANOUT_USER_CHECK(to_int(parts[1], s.step_size) && s.step_size > 0) << "bad lr schedule '" << spec << "'" << usage;
    }
    if (parts.size() == 3) {
      FANOUT_USER_CHECK(to_float(parts[2], s.gamma) && s.gamma > 0) << "bad lr schedule '" << spec << "'" << usage;
    }
  } else if (kind == "multistep" && (parts.size() == 2 || parts.size() == 3)) {
    s.kind = LrSchedule::Kind::MultiStep;
    for (auto& m : split(parts[1], ',')) {
      int v = 0;
      FANOUT_USER_CHECK(to_int(m, v) && v > 0) << "bad lr schedule '" << spec << "'" << usage;
      s.milestones.push_back(v);
    }
    FANOUT_USER_CHECK(std::is_sorted(s.milestones.begin(), s.milestones.end()))
        << "multistep milestones must be increasing in '" << spec << "'";
    if (parts.size() == 3) {
      FANOUT_USER_CHECK(to_float(parts[2], s.gamma) && s.gamma > 0) << "bad lr schedule '" << spec << "'" << usage;
    }
  } else {
    FANOUT_FAIL() << "unknown lr schedule '" << spec << "'" << usage;
  }
  return s;
}

void set_warmup_cosine(LrSchedule& s, int warmup_steps, int lr_decay_steps, float min_lr) {
  FANOUT_USER_CHECK(warmup_steps >= 0 && lr_decay_steps > warmup_steps)
      << "warmup-cosine needs 0 <= --warmup-steps < --lr-decay-steps, got " << warmup_steps << " and "
      << lr_decay_steps;
  FANOUT_USER_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= s.base_lr)
      << "--min-lr must be in [0, --lr] = [0, " << s.base_lr << "], got " << min_lr;
  s.warmup_steps = warmup_steps;
  s.lr_decay_steps = lr_decay_steps;
  s.min_lr = min_lr;
}

}  // namespace fanout::optim
