// Resuming a run from its checkpoint: the policy dp-train applies, for any
// front end. It loads, refuses with one-line errors, and describes what it
// found; printing is the caller's.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/optim/optimizer.h"
#include "runtime/parallel/engine.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/run_config.h"

namespace fanout::train {

// A mid-epoch checkpoint resumed with another batch size
// (RunConfig::allow_batch_change): the rest of epoch state.epoch (0-based)
// runs in batches of `batch_size` from sample `from_sample`, where batches
// of `was` stopped.
struct Rebatch {
  int64_t from_sample = 0, was = 0, batch_size = 0;
};

// A recorded option whose value differs from the checkpoint's: the run will
// not continue exactly as an uninterrupted one.
struct OptionChange {
  std::string key;  // as RunConfig::checkpoint_config names it
  nlohmann::json was, now;
};

struct ResumeOutcome {
  CheckpointState state;  // to continue from; its config is this run's
  std::string path;       // the checkpoint file loaded
  std::optional<Rebatch> rebatch;
  std::vector<OptionChange> changed;  // in the order of this run's config
  bool complete = false;  // state.epoch >= c.epochs: nothing left to train
};

// Resumes from c.resume (a checkpoint file, or a directory's newest:
// resolve_resume_path), loading it into `engine` and `opt` (load_checkpoint;
// every process reads the file). Refused: another c.model; mid-epoch,
// another batch size without c.allow_batch_change; a re-batched rest whose
// samples done the engine's world_size() processes cannot share evenly.
// `config` is this run's RunConfig::checkpoint_config; when both runs are
// split-invariant, devices, world_size and strategy are not changes. A file
// that is not a training checkpoint throws NotATrainingCheckpoint.
ResumeOutcome resume_run(const RunConfig& c, Engine& engine, optim::Optimizer& opt, const nlohmann::json& config);

}  // namespace fanout::train
