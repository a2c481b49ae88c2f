// Resume policy: load the checkpoint, refuse what cannot continue, list what changed.
#include "runtime/train/resume.h"

#include "runtime/core/error.h"
#include "runtime/train/trainer.h"

namespace fanout::train {

namespace {

// The model the checkpoint's run named; empty when its config records none
// (a library's save_checkpoint with a default CheckpointState).
std::string model_of(const CheckpointState& st) {
  const auto it = st.config.find("model");
  return it != st.config.end() && it->is_string() ? it->get<std::string>() : "";
}

// Mid-epoch, another batch size continues the epoch from its sample position
// in batches of the new size (Trainer::train_epoch): asked for explicitly,
// since the run then differs from an uninterrupted one. Each process
// continues at its share of the samples done (rank r of R takes the epoch's
// positions r, r + R, ...): R must divide them.
std::optional<Rebatch> check_mid_epoch(const RunConfig& c, const CheckpointState& st, const std::string& path,
                                       int world) {
  // An epoch whose batches all ran (stopped in its evaluation): nothing to re-batch, any batch size and world.
  if (st.batch == 0 || epoch_done(st.partial)) return std::nullopt;
  const auto size = st.config.find("batch_size");
  const int64_t was = size != st.config.end() && size->is_number_integer() ? size->get<int64_t>() : c.batch_size;
  FANOUT_USER_CHECK(was == c.batch_size || c.allow_batch_change)
      << "checkpoint " << path << " stopped inside epoch " << st.epoch + 1 << " after " << st.batch
      << " batches of " << was << "; resume with --batch-size " << was
      << " (any devices or processes), or add --allow-batch-change to re-batch the rest of that epoch in "
      << c.batch_size;
  const auto count = st.partial.find("count");
  const int64_t done = count != st.partial.end() && count->is_number_integer() ? count->get<int64_t>()
                                                                               : st.batch * was;
  if (was != c.batch_size) {
    FANOUT_USER_CHECK(done % world == 0)
        << "checkpoint " << path << " stopped inside epoch " << st.epoch + 1 << " after " << done
        << " samples, which " << world << " processes cannot share evenly: re-batch on a number of "
        << "processes that divides " << done << ", or resume with --batch-size " << was;
    return Rebatch{done, was, c.batch_size};
  }
  // The same size inside an epoch re-batched before (its batches count from
  // the change): the rest is re-batched again, from the same sample.
  const bool rebatched = !st.partial.empty() && done != st.batch * c.batch_size;
  FANOUT_USER_CHECK(!rebatched || done % world == 0)
      << "cannot continue epoch " << st.epoch + 1 << " after " << done << " samples on " << world
      << " processes: resume on a number of processes that divides it";
  return std::nullopt;
}

// The recorded options that differ; split-invariant runs give the same
// result on any number of CPU devices and processes.
std::vector<OptionChange> changed_options(const RunConfig& c, const nlohmann::json& was, const nlohmann::json& now) {
  const bool any_layout = c.split_invariant && was.contains("split_invariant") && was["split_invariant"] == true;
  std::vector<OptionChange> out;
  for (const auto& [key, value] : now.items()) {
    const bool layout = key == "devices" || key == "world_size" || key == "strategy";
    const auto it = was.find(key);
    if (!(layout && any_layout) && it != was.end() && *it != value) out.push_back({key, *it, value});
  }
  return out;
}

}  // namespace

ResumeOutcome resume_run(const RunConfig& c, Engine& engine, optim::Optimizer& opt, const nlohmann::json& config) {
  FANOUT_CHECK(!c.resume.empty()) << "resume_run needs RunConfig::resume";
  ResumeOutcome r;
  r.path = resolve_resume_path(c.resume);
  r.state = load_checkpoint(r.path, engine, opt, [&](const CheckpointState& st) {
    // Without a recorded model the tensors' names and shapes decide (load_checkpoint checks them).
    const std::string was = model_of(st);
    FANOUT_USER_CHECK(was.empty() || was == c.model)
        << "checkpoint " << r.path << " was trained with --model " << was << ", not " << c.model;
  });
  r.rebatch = check_mid_epoch(c, r.state, r.path, engine.world_size());
  r.changed = changed_options(c, r.state.config, config);
  r.complete = r.state.epoch >= c.epochs;
  r.state.config = config;
  return r;
}

}  // namespace fanout::train
