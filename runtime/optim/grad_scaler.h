// Loss scaling for float16 training, torch.cuda.amp.GradScaler's rules: the
// loss gradient is multiplied by scale() (pass it in the engine's grad_scale),
// the reduced gradients are unscaled and checked before the step, a step
// whose gradients hold inf or NaN is skipped and the scale backs off, and
// the scale grows after growth_interval finite steps in a row. The check
// runs once, on the fully reduced gradient (after DataParallel's reduction,
// DDP's all-reduce and the last micro-batch), so every replica and rank
// skips the same steps; it is the sum of squares of kernels/optim.h (CUB on
// CUDA), which is non-finite exactly when an element is.
//
//   engine.forward_backward(x, y, scaler.scale() / rows, true);
//   if (scaler.unscale(*opt)) optim::clip_grad_norm(*opt, 1.0);  // clip unscaled gradients
//   scaler.step(*opt);  // steps unless inf/NaN was found; updates the scale
//   opt->zero_grad();
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "runtime/optim/optimizer.h"

namespace fanout::optim {

struct GradScalerOptions {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  // One-line errors for what torch refuses: a scale that is not positive and
  // finite, growth_factor <= 1, backoff_factor outside (0, 1), interval < 1.
  explicit GradScaler(const GradScalerOptions& o = {});
  float scale() const { return scale_; }
  // Multiplies opt's gradients by 1 / scale() (the reciprocal rounded to
  // float once, as torch) unless one of them is inf or NaN; returns whether
  // they were all finite. At most once per step.
  bool unscale(Optimizer& opt);
  // opt.step() unless the step's gradients held inf or NaN (unscale() runs
  // here when it has not), then the scale's update. Returns whether it stepped.
  bool step(Optimizer& opt);
  int64_t growth_tracker() const { return growth_tracker_; }  // finite steps in a row since the last change
  int64_t skipped() const { return skipped_; }                // steps skipped so far
  // For checkpoints: {"scale", "growth_tracker", "skipped"}; load_state checks it.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

 private:
  void update(bool found_inf);
  GradScalerOptions o_;
  float scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
  enum class Stage { Ready, Unscaled } stage_ = Stage::Ready;
  bool found_inf_ = false;
};

}  // namespace fanout::optim
