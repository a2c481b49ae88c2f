// Learning-rate schedules as closed forms of (epoch, step within epoch), so a
// resumed run needs no scheduler state: step, multistep and cosine
// (torch.optim.lr_scheduler StepLR, MultiStepLR, CosineAnnealingLR stepped
// once per epoch), each with optional linear warm-up stepped per iteration
// from base_lr / (warmup_steps) up to the schedule's value.
#pragma once
#include <string>
#include <vector>

namespace fanout::optim {

struct LrSchedule {
  enum class Kind { Constant, Step, MultiStep, Cosine };
  Kind kind = Kind::Constant;
  float base_lr = 0.1f;
  float gamma = 0.1f;            // step, multistep
  int step_size = 30;            // step: epochs between decays
  std::vector<int> milestones;   // multistep: epochs at which lr *= gamma
  int total_epochs = 1;          // cosine: T_max in epochs
  float eta_min = 0.0f;          // cosine floor
  float warmup_epochs = 0.0f;    // linear warm-up length (may be fractional)

  // lr for the given epoch (0-based) and step in it; steps_per_epoch > 0.
  float at(int epoch, int step, int steps_per_epoch) const;
};

// Parses "constant", "step[:STEP_SIZE[:GAMMA]]", "multistep:M1,M2,...[:GAMMA]",
// "cosine"; a one-line error otherwise. total_epochs feeds cosine.
LrSchedule parse_lr_schedule(const std::string& spec, float base_lr, int total_epochs, float warmup_epochs);

}  // namespace fanout::optim
