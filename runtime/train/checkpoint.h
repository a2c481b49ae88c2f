// Training checkpoints: one safetensors file holding everything an exact
// resume needs.
//
// Tensors: the model's state_dict under its torchvision names and, once the
// optimizer has state, `optimizer.<state>.<parameter name>` per state and
// parameter under torch's state names (momentum_buffer; exp_avg, exp_avg_sq,
// max_exp_avg_sq). A PyTorch model loads the file after dropping the
// `optimizer.` keys; best.safetensors holds the model alone.
// Metadata (strings): format, epoch (completed), step (optimizer steps),
// best_test_acc, optimizer (JSON: type, hyper-parameters, groups, steps), rng (the primary
// context's generator state), sampler (JSON: kind, seed, next epoch; the
// shuffle and augmentation are pure functions of seed, epoch and sample
// index, so nothing else is needed), config (JSON: the training options),
// metrics (JSON: the last epoch's summary) and, with loss scaling,
// grad_scaler (JSON: scale, growth tracker, steps skipped).
#pragma once
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/file_lock.h"
#include "runtime/io/file_io.h"
#include "runtime/io/state_dict.h"
#include "runtime/parallel/engine.h"
#include "runtime/train/trainer.h"

namespace fanout::train {

inline constexpr const char* kCheckpointFormat = "fanout-checkpoint-1";
// best.safetensors: the model's state_dict only, with the same metadata but no optimizer.
inline constexpr const char* kWeightsFormat = "fanout-weights-1";
// The prefix of every optimizer tensor in a checkpoint.
inline constexpr const char* kOptimizerPrefix = "optimizer.";

struct CheckpointState {
  int epoch = 0;                 // epochs completed
  int64_t step = 0;              // the run's steps: the optimizer's and the loss scaler's skipped ones
  // A mid-epoch checkpoint: batches of epoch `epoch` (0-based: the one in
  // progress) done, and their totals over every process (0 and {}: none).
  // The totals' count is the position in samples; in an epoch re-batched
  // after a batch-size change, `batch` counts the batches since the change.
  int64_t batch = 0;
  nlohmann::json partial = nlohmann::json::object();
  // The best EpochMetrics::best_score() so far (the test value of the
  // criterion's metric that picks the best: accuracy, heatmaps' share within
  // 2 voxels; without one 1 / (1 + test loss)); -1: none yet.
  double best_test_acc = -1;
  nlohmann::json config = nlohmann::json::object();   // training options, as the front end names them
  nlohmann::json metrics = nlohmann::json::object();  // the last epoch's summary
  double score = -1;  // the last epoch's EpochMetrics::best_score(), for CheckpointSaver; not saved
  // The loss scaler's state (GradScaler::state(); 16-mixed runs), empty when there is none.
  nlohmann::json grad_scaler = nlohmann::json::object();
  // The launch that writes it (a launcher's run id), so that a restarted worker tells this launch's
  // checkpoints from those of a run it replaces (metadata "run_id"; empty: not recorded).
  std::string run_id;
};

// Writes the engine's model, the optimizer's state and the RNG state plus
// `st` to `path`, atomically (a crash leaves any previous file at `path`
// intact). Without an optimizer: the model alone (kWeightsFormat). With
// `staged`, it is one of files replaced together (io::StagedFiles).
void save_checkpoint(const std::string& path, Engine& engine, optim::Optimizer* opt, const CheckpointState& st,
                     io::StagedFiles* staged = nullptr);

// What load_checkpoint throws for a file without kCheckpointFormat (weights
// alone, or not ours): callers catch it by type to suggest loading weights.
class NotATrainingCheckpoint : public Error {
 public:
  NotATrainingCheckpoint(std::string path, const std::string& what) : Error(what), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Restores model, optimizer and RNG state into `engine` and `opt` (any
// device: the file holds host tensors) and returns the saved state. Strict:
// a missing, unexpected or mismatched tensor, another optimizer type, or a
// file that is not a fanout training checkpoint (NotATrainingCheckpoint), is
// one fanout::Error naming the file; the model's mismatch is reported before
// the optimizer's. `check`, when given, sees the saved state before
// anything is restored and may throw to refuse it. The state is kept per
// parameter, so `opt`'s groups and hyper-parameters (learning rate, weight
// decay, betas, group scales) stay `opt`'s, not the file's, as dp-train's
// --resume takes them from its command line (train::resume_run lists what
// changed); torch's load_state_dict takes the saved groups' values instead.
CheckpointState load_checkpoint(const std::string& path, Engine& engine, optim::Optimizer& opt,
                                const std::function<void(const CheckpointState&)>& check = {});

// Loads model weights only (a checkpoint of ours or any safetensors
// state_dict, e.g. one exported from PyTorch), ignoring optimizer entries.
// Non-strict loads what fits; the report lists the rest.
// `metadata`, when given, receives the file's string metadata (a dp-train
// checkpoint's "config": its model, its data's vocabulary).
io::LoadReport load_weights(const std::string& path, Module& model, bool strict,
                            std::map<std::string, std::string>* metadata = nullptr);

// The checkpoint to resume from: `path` itself when it is a file; in a
// directory the furthest one, epoch-NNNN.safetensors (N epochs done) or
// epoch-NNNN-batch-BBBBBBB.safetensors (N epochs and B batches done).
std::string resolve_resume_path(const std::string& path);
// The furthest checkpoint in directory `dir` as above; empty when it holds none.
std::string newest_checkpoint(const std::string& dir);

// Holds a save directory for one run: an exclusive lock on DIR/.fanout.lock
// (flock: the kernel drops it when the process dies, so a crash never blocks
// the next run) that records the holder's pid, start time and command line.
// Taking it checks that DIR can be written, and removes the temporaries
// (*.tmp.PID.N) a run that died while saving left there. A directory that is
// held, or cannot be created or written, is one fanout::Error.
class SaveDirLock {
 public:
  // `for_workers`: a launcher holds the directory for the workers it starts
  // and restarts (another run cannot take it between two starts), giving
  // them workers_env(): a worker a fanout launcher started (FANOUT_LAUNCHED)
  // that finds its directory in FANOUT_SAVE_DIR_LOCK takes no lock of its
  // own (it still checks write access and removes what a run that died
  // while saving left).
  explicit SaveDirLock(const std::string& dir, bool for_workers = false);
  int removed_temporaries() const { return removed_; }
  std::string workers_env() const { return "FANOUT_SAVE_DIR_LOCK=" + canonical_; }

 private:
  std::string canonical_;
  void check_writable_and_clean(const std::string& dir);
  FileLock lock_;
  int removed_ = 0;
};

// Saves epoch-NNNN.safetensors into a directory every `every` epochs (and
// after the last one), keeps the newest `keep_last` of them, and keeps
// best.safetensors for the best test accuracy seen. It holds the
// directory's SaveDirLock for its lifetime.
class CheckpointSaver {
 public:
  CheckpointSaver(std::string dir, int every, int keep_last);
  const SaveDirLock& lock() const { return *lock_; }
  // Call after each epoch's evaluation; st.epoch is the epoch just completed,
  // st.score its EpochMetrics::best_score() (best.safetensors is written when
  // it beats st.best_test_acc), last_epoch the last one this process trains
  // (always saved).
  // Returns the paths written (empty when this epoch is not saved).
  std::vector<std::string> on_epoch_end(Engine& engine, optim::Optimizer& opt, CheckpointState& st, int last_epoch);
  // best.safetensors (the model alone) when st.score beats st.best_test_acc,
  // which it then becomes: after an evaluation inside an epoch. Returns the
  // path written, or empty.
  std::string save_if_best(Engine& engine, CheckpointState& st);
  // Mid-epoch (--save-every-steps, or a stop): epoch-NNNN-batch-BBBBBBB, and
  // the same rotation over every epoch and mid-epoch file.
  std::string save_mid_epoch(Engine& engine, optim::Optimizer& opt, const CheckpointState& st);
  static std::string epoch_file(int epoch);  // "epoch-0003.safetensors"
  // The directory's checkpoints (epoch and mid-epoch files, best.safetensors),
  // sorted by name.
  std::vector<std::string> checkpoints() const;
  // The checkpoints here past `path`'s place in the run (a resume from an
  // earlier one would leave them to win the next --resume DIR), full paths.
  std::vector<std::string> checkpoints_after(const std::string& path) const;
  // Files (full paths) this run replaces: an earlier run's checkpoints, or
  // those past the one resumed. remove_replaced() removes them, all or,
  // with an error that names the one that cannot go, none (one gone
  // already counts as removed), and returns how many it removed; the first
  // save calls it when the caller has not. dp-train calls it once every
  // check has passed, just before training, so a run refused at its start
  // leaves them.
  void replace(std::vector<std::string> files);
  int remove_replaced();
  // After a resume: a best score st records whose best.safetensors is not
  // here whole (lost, cut short, or this is another directory) is
  // forgotten, so that the next evaluation writes the file. Returns why
  // (empty: kept).
  std::string forget_missing_best(CheckpointState& st) const;

 private:
  // Keeps the newest keep_last checkpoints at or before just_written's place
  // in the run (epochs done, then optimizer steps).
  void rotate(const std::string& just_written);
  std::string save_best(Engine& engine, const CheckpointState& st, io::StagedFiles* staged = nullptr);
  // Removes the replaced files, then renames the staged files into place.
  void commit(io::StagedFiles& files);
  std::string dir_;
  int every_, keep_last_;
  std::vector<std::string> replaced_;
  std::unique_ptr<SaveDirLock> lock_;
};

}  // namespace fanout::train
