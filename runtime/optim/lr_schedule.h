// Learning-rate schedules as closed forms of (epoch, step within epoch), so a
// resumed run needs no scheduler state: step, multistep and cosine
// (torch.optim.lr_scheduler StepLR, MultiStepLR, CosineAnnealingLR stepped
// once per epoch), each with optional linear warm-up stepped per iteration
// from base_lr / (warmup_steps) up to the schedule's value; and nanoGPT's
// warmup-cosine, per optimizer step: base_lr (it + 1) / (warmup + 1) for the
// first `warmup_steps`, then a cosine from base_lr to min_lr at
// lr_decay_steps, min_lr after.
#pragma once
#include <string>
#include <vector>

namespace fanout::optim {

struct LrSchedule {
  enum class Kind { Constant, Step, MultiStep, Cosine, WarmupCosine };
  Kind kind = Kind::Constant;
  float base_lr = 0.1f;
  float gamma = 0.1f;            // step, multistep
  int step_size = 30;            // step: epochs between decays (parse_lr_schedule's default: a third of the epochs)
  std::vector<int> milestones;   // multistep: epochs at which lr *= gamma
  int total_epochs = 1;          // cosine: T_max in epochs
  float eta_min = 0.0f;          // cosine floor
  float warmup_epochs = 0.0f;    // linear warm-up length (may be fractional)
  int warmup_steps = 0;          // warmup-cosine: nanoGPT's warmup_iters
  int lr_decay_steps = 0;        // warmup-cosine: lr_decay_iters
  float min_lr = 0.0f;           // warmup-cosine: min_lr

  // lr for the given epoch (0-based) and step in it; steps_per_epoch > 0.
  float at(int epoch, int step, int steps_per_epoch) const;
  // warmup-cosine's rate at the run's step `it` (0-based: the steps taken
  // before it, nanoGPT's iter_num); a trainer passes its own count, which a
  // resume continues whatever the epochs' lengths were.
  float at_run_step(int64_t it) const;
  bool per_run_step() const { return kind == Kind::WarmupCosine; }
};

// Parses "constant", "step[:STEP_SIZE[:GAMMA]]", "multistep:M1,M2,...[:GAMMA]",
// "cosine", "warmup-cosine"; a one-line error otherwise. total_epochs feeds
// cosine; warmup-cosine takes its steps from set_warmup_cosine.
LrSchedule parse_lr_schedule(const std::string& spec, float base_lr, int total_epochs, float warmup_epochs);
// warmup-cosine's lengths and floor; one-line errors unless 0 <= warmup <
// decay and 0 <= min_lr <= base_lr.
void set_warmup_cosine(LrSchedule& s, int warmup_steps, int lr_decay_steps, float min_lr);

}  // namespace fanout::optim
