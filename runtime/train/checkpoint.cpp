// Checkpoint save / load / rotation.
#include "runtime/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <system_error>

#include "runtime/core/error.h"
#include "runtime/io/file_io.h"
#include "runtime/io/safetensors.h"

namespace fanout::train {

namespace fs = std::filesystem;

namespace {

const std::string& meta(const io::TensorFile& f, const std::string& key, const std::string& path) {
  auto it = f.metadata.find(key);
  FANOUT_USER_CHECK(it != f.metadata.end()) << "checkpoint " << path << " has no '" << key << "' metadata";
  return it->second;
}

nlohmann::json meta_json(const io::TensorFile& f, const std::string& key, const std::string& path) {
  const std::string& s = meta(f, key, path);
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  FANOUT_USER_CHECK(!j.is_discarded()) << "checkpoint " << path << ": metadata '" << key << "' is not valid JSON";
  return j;
}

int64_t meta_int(const io::TensorFile& f, const std::string& key, const std::string& path) {
  const std::string& s = meta(f, key, path);
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FANOUT_USER_CHECK(used == s.size() && used > 0 && v >= 0)
      << "checkpoint " << path << ": metadata '" << key << "' is not a non-negative integer: '" << s << "'";
  return v;
}

// Reads a run of 1..max_digits decimal digits at s[pos]; -1 when there is none or it is longer.
int64_t digits_at(const std::string& s, size_t& pos, size_t max_digits) {
  const size_t start = pos;
  int64_t v = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && pos - start < max_digits) v = v * 10 + (s[pos++] - '0');
  const bool more = pos < s.size() && s[pos] >= '0' && s[pos] <= '9';
  return pos == start || more ? -1 : v;
}

bool eat(const std::string& s, size_t& pos, std::string_view word) {
  if (s.compare(pos, word.size(), word) != 0) return false;
  pos += word.size();
  return true;
}

// (epochs, batches) done for epoch-NNNN.safetensors (batches 0) or
// epoch-NNNN-batch-BBBBBBB.safetensors; {-1, -1} for any other name.
std::pair<int64_t, int64_t> progress_of(const fs::path& p) {
  const std::string name = p.filename().string();
  size_t pos = 0;
  if (!eat(name, pos, "epoch-")) return {-1, -1};
  const int64_t epochs = digits_at(name, pos, 9);
  int64_t batches = 0;
  if (epochs >= 0 && eat(name, pos, "-batch-")) batches = digits_at(name, pos, 12);
  if (epochs < 0 || batches < 0 || !eat(name, pos, ".safetensors") || pos != name.size()) return {-1, -1};
  return {epochs, batches};
}

// Where a checkpoint file stands in its run: (epochs done, optimizer steps),
// the steps from its header's metadata (the batch in a name counts from a
// --allow-batch-change re-batch, so it does not order positions), else the
// name's batches; {-1, -1} for a name that is no checkpoint's.
std::pair<int64_t, int64_t> run_position(const fs::path& p) {
  const auto [epochs, batches] = progress_of(p);
  if (epochs < 0) return {-1, -1};
  int64_t step = -1;
  std::ifstream f(p, std::ios::binary);
  uint64_t n = 0;
  if (f.read(reinterpret_cast<char*>(&n), 8) && n > 0 && n <= io::kMaxSafetensorsHeader) {
    std::string header(n, '\0');
    if (f.read(header.data(), static_cast<std::streamsize>(n))) {
      const nlohmann::json j = nlohmann::json::parse(header, nullptr, false);
      if (j.is_object() && j.contains("__metadata__") && j["__metadata__"].is_object() &&
          j["__metadata__"].contains("step") && j["__metadata__"]["step"].is_string()) {
        try {
          step = std::stoll(j["__metadata__"]["step"].get<std::string>());
        } catch (const std::exception&) {
          step = -1;
        }
      }
    }
  }
  return {epochs, step >= 0 ? step : batches};
}

// A temporary left by write_file_atomic: NAME.tmp.PID.N (NAME.tmp.PID before N).
bool is_temporary(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return false;
  const std::string rest = name.substr(at + 5);
  const size_t dot = rest.find('.');
  const auto digits = [](const std::string& d) {
    return !d.empty() && d.find_first_not_of("0123456789") == std::string::npos;
  };
  return dot == std::string::npos ? digits(rest) : digits(rest.substr(0, dot)) && digits(rest.substr(dot + 1));
}

}  // namespace

void save_checkpoint(const std::string& path, Engine& engine, optim::Optimizer* opt, const CheckpointState& st,
                     io::StagedFiles* staged) {
  Module& model = engine.model();
  std::vector<std::pair<std::string, Tensor>> tensors = model.state_dict();
  nlohmann::json hyper = nullptr;
  if (opt) {
    FANOUT_CHECK(&opt->model() == &model) << "the optimizer does not step the engine's model";
    FANOUT_CHECK(opt->state_complete())
        << "the optimizer's state is sharded across processes: every process calls gather_state() before a checkpoint";
    const auto params = model.named_parameters();
    for (auto& [state, arena] : opt->state()) {
      FANOUT_CHECK(arena->numel() == model.arenas().params.numel())
          << "optimizer state '" << state << "' covers part of the arena: save its sharded owner";
      for (auto& [name, p] : params)
        tensors.emplace_back(kOptimizerPrefix + state + "." + name, arena->flat(p->offset, p->shape));
    }
    hyper = opt->hyper();
    hyper["steps"] = opt->steps();
  }
  std::ostringstream rng;
  rng << engine.primary_context().rng();
  std::ostringstream best;
  best.precision(17);
  best << st.best_test_acc;
  std::map<std::string, std::string> md = {
      {"format", opt ? kCheckpointFormat : kWeightsFormat},
      {"epoch", std::to_string(st.epoch)},
      {"step", std::to_string(st.step)},
      {"best_test_acc", best.str()},
      {"optimizer", hyper.dump()},
      {"rng", rng.str()},
      {"sampler", nlohmann::json{{"kind", "random"},
                                 {"seed", st.config.value("seed", nlohmann::json(0))},
                                 {"next_epoch", st.epoch}}
                      .dump()},
      {"config", st.config.dump()},
      {"metrics", st.metrics.dump()},
      {"batch", std::to_string(st.batch)},
      {"partial", st.partial.dump()},
  };
  if (!st.grad_scaler.empty()) md["grad_scaler"] = st.grad_scaler.dump();
  if (!st.run_id.empty()) md["run_id"] = st.run_id;
  io::save_safetensors(path, tensors, md, staged);
}

namespace {
// A diverged run's weights are no start: say so when they load, not as a
// diverged loss later (tensors the model does not take are not looked at).
void check_finite(const std::string& name, const Tensor& t) {
  bool ok = true;
  if (t.dtype() == DType::F32) ok = std::all_of(t.f32(), t.f32() + t.numel(), [](float v) { return std::isfinite(v); });
  else if (t.dtype() == DType::F64) ok = std::all_of(t.f64(), t.f64() + t.numel(), [](double v) { return std::isfinite(v); });
  FANOUT_USER_CHECK(ok) << name << " holds non-finite values (NaN or infinity)";
}
}  // namespace

CheckpointState load_checkpoint(const std::string& path, Engine& engine, optim::Optimizer& opt,
                                const std::function<void(const CheckpointState&)>& check) {
  io::TensorFile f = io::load_safetensors(path);
  auto fmt = f.metadata.find("format");
  if (fmt == f.metadata.end() || fmt->second != kCheckpointFormat)
    throw NotATrainingCheckpoint(path, path + " is not a fanout training checkpoint (no format '" + kCheckpointFormat +
                                 "' in its metadata); load its weights alone instead (load_weights)");
  CheckpointState st;
  const int64_t epoch = meta_int(f, "epoch", path);
  FANOUT_USER_CHECK(epoch <= 1000000) << "checkpoint " << path << ": metadata 'epoch' is out of range: " << epoch;
  st.epoch = static_cast<int>(epoch);
  st.step = meta_int(f, "step", path);
  {
    const std::string& b = meta(f, "best_test_acc", path);
    size_t used = 0;
    try {
      st.best_test_acc = std::stod(b, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FANOUT_USER_CHECK(used == b.size() && used > 0 && std::isfinite(st.best_test_acc))
        << "checkpoint " << path << ": metadata 'best_test_acc' is not a finite number: '" << b << "'";
  }
  st.config = meta_json(f, "config", path);
  st.metrics = meta_json(f, "metrics", path);
  if (f.metadata.count("batch")) {  // absent from end-of-epoch checkpoints of earlier versions
    st.batch = meta_int(f, "batch", path);
    st.partial = meta_json(f, "partial", path);
    FANOUT_USER_CHECK(st.batch >= 0 && st.partial.is_object())
        << "checkpoint " << path << ": metadata 'batch' and 'partial' are not a position in an epoch";
  }
  FANOUT_USER_CHECK(st.config.is_object() && st.metrics.is_object())
      << "checkpoint " << path << ": metadata 'config' and 'metrics' must be JSON objects";
  if (f.metadata.count("grad_scaler")) {
    st.grad_scaler = meta_json(f, "grad_scaler", path);
    FANOUT_USER_CHECK(st.grad_scaler.is_object())
        << "checkpoint " << path << ": metadata 'grad_scaler' must be a JSON object";
  }
  // A 16-mixed run's scale and skipped steps would start over silently.
  FANOUT_USER_CHECK(!st.grad_scaler.empty() || !st.config.contains("precision") || st.config["precision"] != "16-mixed")
      << "checkpoint " << path << ": a 16-mixed run's checkpoint without the loss scaler's state (metadata "
      << "'grad_scaler')";
  if (check) check(st);
  const nlohmann::json saved = meta_json(f, "optimizer", path);
  FANOUT_USER_CHECK(saved.is_object() && saved.contains("type") && saved["type"].is_string() &&
                    saved.contains("steps") && saved["steps"].is_number_integer() && saved["steps"].get<int64_t>() >= 0)
      << "checkpoint " << path << ": optimizer metadata is not an optimizer state";
  const int64_t steps = saved["steps"].get<int64_t>();

  // Split the file into model tensors and optimizer state (by state name, then parameter).
  std::vector<std::pair<std::string, Tensor>> weights;
  std::map<std::string, std::map<std::string, Tensor>> state;
  const size_t plen = std::char_traits<char>::length(kOptimizerPrefix);
  for (auto& [name, t] : f.tensors) {
    if (name.rfind(kOptimizerPrefix, 0) != 0) {
      weights.emplace_back(name, t);
      continue;
    }
    const size_t dot = name.find('.', plen);
    FANOUT_USER_CHECK(dot != std::string::npos) << "checkpoint " << path << ": bad optimizer tensor name " << name;
    state[name.substr(plen, dot - plen)].emplace(name.substr(dot + 1), t);
  }
  Module& model = engine.model();
  FANOUT_CHECK(&opt.model() == &model) << "the optimizer does not step the engine's model";
  // Check everything before writing anything: the model first.
  try {
    io::check_state_dict(model, weights);
  } catch (const Error& e) {
    FANOUT_FAIL() << "checkpoint " << path << ": " << e.what();
  }
  const std::string type = saved["type"].get<std::string>();
  FANOUT_USER_CHECK(type == opt.type())
      << "checkpoint " << path << " was trained with " << type << ", this run's optimizer is " << opt.type()
      << " (resume it with the same optimizer)";
  const auto params = model.named_parameters();
  const std::vector<std::string> want = opt.state_names();
  // Whether the saved optimizer had state: older checkpoints said whether
  // SGD's momentum buffer existed; newer ones hold state from the first step.
  bool has_state = steps > 0 && !state.empty();
  if (saved.contains("has_momentum_buffer")) {
    FANOUT_USER_CHECK(saved["has_momentum_buffer"].is_boolean())
        << "checkpoint " << path << ": optimizer metadata 'has_momentum_buffer' is not a boolean";
    has_state = saved["has_momentum_buffer"].get<bool>();
  }
  FANOUT_USER_CHECK(has_state || steps == 0 || want.empty())
      << "checkpoint " << path << " holds no optimizer state '" << want.front() << "' after " << steps
      << " steps: its " << type << " was configured without it (resume with the same optimizer settings)";
  if (has_state) {
    for (const std::string& n : want) {
      auto it = state.find(n);
      FANOUT_USER_CHECK(it != state.end()) << "checkpoint " << path << " has no optimizer state '" << n << "' (its "
                                           << type << " was configured differently)";
      FANOUT_USER_CHECK(it->second.size() == params.size())
          << "checkpoint " << path << " holds '" << n << "' for " << it->second.size() << " of " << params.size()
          << " parameters";
      for (auto& [name, p] : params) {
        auto t = it->second.find(name);
        FANOUT_USER_CHECK(t != it->second.end()) << "checkpoint " << path << " has no " << n << " for " << name;
        FANOUT_USER_CHECK(t->second.shape() == p->shape && t->second.dtype() == DType::F32)
            << "checkpoint " << path << ": " << n << " of " << name << " is " << t->second.shape().str()
            << ", the parameter is " << p->shape.str();
      }
    }
  }
  for (auto& [n, m] : state)
    FANOUT_USER_CHECK(has_state && std::find(want.begin(), want.end(), n) != want.end())
        << "checkpoint " << path << " holds optimizer state '" << n << "' that this " << opt.type()
        << " does not have";
  std::mt19937_64 rng;
  std::istringstream rs(meta(f, "rng", path));
  rs >> rng;
  FANOUT_USER_CHECK(!rs.fail()) << "checkpoint " << path << ": metadata 'rng' is not a generator state";

  // The optimizer's state is checked as the weights are (before anything is written): a damaged file is
  // named, not reported later as a diverging run.
  for (auto& [n, m] : state)
    for (auto& [name, t] : m) {
      try {
        check_finite(n + "." + name, t);
      } catch (const Error& e) {
        FANOUT_FAIL() << "checkpoint " << path << ": optimizer state " << e.what();
      }
    }
  try {
    io::load_state_dict(model, weights, /*strict=*/true, check_finite);
  } catch (const Error& e) {
    FANOUT_FAIL() << "checkpoint " << path << ": " << e.what();
  }
  opt.set_steps(steps);
  if (has_state) {
    for (auto& [n, arena] : opt.state())
      for (auto& [name, p] : params) arena->flat(p->offset, p->shape).copy_from(state.at(n).at(name));
    opt.state_written();
  }
  engine.primary_context().rng() = rng;
  return st;
}

io::LoadReport load_weights(const std::string& path, Module& model, bool strict,
                            std::map<std::string, std::string>* metadata) {
  io::TensorFile f = io::load_safetensors(path);
  if (metadata) *metadata = f.metadata;
  std::vector<std::pair<std::string, Tensor>> weights;
  for (auto& [name, t] : f.tensors)
    if (name.rfind(kOptimizerPrefix, 0) != 0) weights.emplace_back(name, t);
  try {
    model.adapt_state_dict(weights);
  } catch (const Error& e) {
    FANOUT_FAIL() << path << ": " << e.what();
  }
  try {
    return io::load_state_dict(model, weights, strict, check_finite);
  } catch (const Error& e) {
    FANOUT_FAIL() << path << ": " << e.what();
  }
}

std::string newest_checkpoint(const std::string& dir) {
  std::pair<int64_t, int64_t> best{-1, -1};
  std::string found;
  try {
    for (const auto& e : fs::directory_iterator(dir)) {
      const auto n = run_position(e.path());
      if (n > best) best = n, found = e.path().string();
    }
  } catch (const fs::filesystem_error& e) {
    FANOUT_FAIL() << "cannot read directory " << dir << ": " << e.code().message();
  }
  return found;
}

std::string resolve_resume_path(const std::string& path) {
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  FANOUT_USER_CHECK(!ec && fs::exists(s)) << "cannot resume: " << path << " does not exist";
  if (!fs::is_directory(s)) return path;
  const std::string found = newest_checkpoint(path);
  FANOUT_USER_CHECK(!found.empty()) << "cannot resume: no epoch-NNNN.safetensors checkpoint in " << path;
  return found;
}

namespace {
std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!s.empty() && s.back() == '\0') s.pop_back();
  std::replace(s.begin(), s.end(), '\0', ' ');
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}
}  // namespace

SaveDirLock::SaveDirLock(const std::string& dir, bool for_workers) {
  io::create_directories(dir, "checkpoint directory");
  std::error_code ec;
  canonical_ = fs::weakly_canonical(dir, ec).string();
  const char* held = std::getenv("FANOUT_SAVE_DIR_LOCK");
  if (!for_workers && held && std::getenv("FANOUT_LAUNCHED") && !canonical_.empty() && canonical_ == held) {
    check_writable_and_clean(dir);  // our launcher holds the lock for us
    return;
  }
  const std::string path = (fs::path(dir) / ".fanout.lock").string();
  FANOUT_USER_CHECK(!fs::exists(path, ec) || fs::is_regular_file(path, ec))
      << path << ", the checkpoint directory's lock file, is not a regular file (remove it)";
  const std::string who = "pid " + std::to_string(::getpid()) + ", since " + now_utc() + ": " + command_line() + "\n";
  std::string holder;
  const int err = lock_.take(path, who, &holder);
  FANOUT_USER_CHECK(err != EWOULDBLOCK)
      << "checkpoint directory " << dir << " is in use by another run (" << (holder.empty() ? "unknown" : holder)
      << "); give each run its own save directory";
  FANOUT_USER_CHECK(err == 0) << "cannot " << (std::strcmp(lock_.failed_step(), "lock") == 0 ? "lock" : "write to")
                              << " checkpoint directory " << dir << ": " << std::strerror(err);
  if (for_workers) return;  // the workers check and clean (workers_env())
  check_writable_and_clean(dir);
}

void SaveDirLock::check_writable_and_clean(const std::string& dir) {
  // Write access, checked now rather than at the first save.
  const std::string probe = (fs::path(dir) / (".write-test." + std::to_string(::getpid()))).string();
  const int p = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int probe_err = errno;
  if (p >= 0) {
    ::close(p);
    ::unlink(probe.c_str());
  }
  if (p < 0) {
    lock_.release();
    FANOUT_FAIL() << "cannot write to checkpoint directory " << dir << ": " << std::strerror(probe_err);
  }
  // Temporaries of a run that died while saving: nobody else can be writing here now.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec) || !is_temporary(e.path().filename().string())) continue;
    if (fs::remove(e.path(), ec)) ++removed_;
  }
}

CheckpointSaver::CheckpointSaver(std::string dir, int every, int keep_last)
    : dir_(std::move(dir)), every_(every), keep_last_(keep_last) {
  FANOUT_USER_CHECK(every >= 1) << "checkpoints every N epochs need N of at least 1, got " << every;
  FANOUT_USER_CHECK(keep_last >= 1) << "keeping the newest N checkpoints needs N of at least 1, got " << keep_last;
  lock_ = std::make_unique<SaveDirLock>(dir_);
}

// Keeps the newest keep_last epoch and mid-epoch files up to (epoch, batch)
// (later ones, from a run this one branched off, are left alone; so is the
// file just written).
void CheckpointSaver::rotate(const std::string& just_written) {
  std::vector<std::pair<std::pair<int64_t, int64_t>, fs::path>> files;
  std::error_code ec;
  const auto written = run_position(just_written);
  try {
    for (const auto& e : fs::directory_iterator(dir_)) {
      const auto n = run_position(e.path());
      if (n.first >= 0 && n <= written) files.emplace_back(n, e.path());
    }
  } catch (const fs::filesystem_error& e) {
    FANOUT_FAIL() << "cannot read checkpoint directory " << dir_ << ": " << e.code().message();
  }
  std::sort(files.begin(), files.end());
  for (size_t i = 0; i + keep_last_ < files.size(); ++i) {
    if (files[i].second == fs::path(just_written) || fs::remove(files[i].second, ec) || !ec) continue;
    // The run goes on (the new checkpoint is safe), but the disk fills where the user expects it not to.
    std::fprintf(stderr, "fanout: warning: cannot remove the old checkpoint %s (--keep-last %d): %s\n",
                 files[i].second.c_str(), keep_last_, ec.message().c_str());
  }
}

std::string CheckpointSaver::save_mid_epoch(Engine& engine, optim::Optimizer& opt, const CheckpointState& st) {
  // Batch 0 names the epoch's end checkpoint: a position inside an epoch never has it.
  FANOUT_CHECK(st.batch > 0 || st.partial.empty()) << "a mid-epoch checkpoint at batch 0 with the epoch's totals";
  char name[96];
  std::snprintf(name, sizeof name, "epoch-%04d-batch-%07lld.safetensors", st.epoch, static_cast<long long>(st.batch));
  const std::string p = (fs::path(dir_) / (st.batch == 0 ? epoch_file(st.epoch) : std::string(name))).string();
  io::StagedFiles files;
  save_checkpoint(p, engine, &opt, st, &files);
  commit(files);
  rotate(p);
  return p;
}

std::vector<std::string> CheckpointSaver::checkpoints_after(const std::string& path) const {
  const auto from = run_position(path);
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::string& name : checkpoints()) {
    const fs::path c = fs::path(dir_) / name;
    if (run_position(c) > from && !fs::equivalent(c, path, ec)) out.push_back(c.string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> CheckpointSaver::checkpoints() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code type_ec;
    if (!e.is_regular_file(type_ec)) continue;  // a folder by a checkpoint's name is the user's
    if (progress_of(e.path()).first >= 0 || name == "best.safetensors") out.push_back(name);
  }
  FANOUT_USER_CHECK(!ec) << "cannot read checkpoint directory " << dir_ << ": " << ec.message();
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// PATH.tmp.PID.I: a name the next lock of the directory removes (is_temporary).
std::string aside_name(const std::string& path, size_t i) {
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(i);
}

}  // namespace

void CheckpointSaver::replace(std::vector<std::string> files) { replaced_ = std::move(files); }

int CheckpointSaver::remove_replaced() {
  // Every one renamed aside first (one gone already counts as removed), so that a failure puts back
  // those moved and removes none.
  std::vector<size_t> moved;
  for (size_t i = 0; i < replaced_.size(); ++i) {
    if (::rename(replaced_[i].c_str(), aside_name(replaced_[i], i).c_str()) == 0) {
      moved.push_back(i);
      continue;
    }
    const int err = errno;
    if (err == ENOENT) continue;
    for (size_t k : moved) ::rename(aside_name(replaced_[k], k).c_str(), replaced_[k].c_str());
    FANOUT_FAIL() << "cannot remove " << replaced_[i] << ": " << std::strerror(err) << " (nothing removed)";
  }
  for (size_t k : moved) ::unlink(aside_name(replaced_[k], k).c_str());  // one left behind: the next lock's
  replaced_.clear();
  return static_cast<int>(moved.size());
}

std::string CheckpointSaver::forget_missing_best(CheckpointState& st) const {
  if (st.best_test_acc < 0) return "";  // none recorded
  const std::string path = (fs::path(dir_) / "best.safetensors").string();
  std::string why;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    why = "no best.safetensors in " + dir_;
  } else {
    try {
      io::read_safetensors_metadata(path);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (!why.empty()) st.best_test_acc = -1;
  return why;
}

void CheckpointSaver::commit(io::StagedFiles& files) {
  remove_replaced();  // when the caller has not yet
  files.commit();
}

std::string CheckpointSaver::epoch_file(int epoch) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "epoch-%04d.safetensors", epoch);
  return buf;
}

std::vector<std::string> CheckpointSaver::on_epoch_end(Engine& engine, optim::Optimizer& opt, CheckpointState& st,
                                                       int last_epoch) {
  const bool best = st.score > st.best_test_acc;  // the criterion's choice (EpochMetrics::best_score)
  const bool due = st.epoch % every_ == 0 || st.epoch == last_epoch;
  if (!best && !due) return {};
  const double best_before = st.best_test_acc;
  if (best) st.best_test_acc = st.score;
  // Both files or neither: an epoch checkpoint that records a best score whose best.safetensors did not
  // get written would resume believing it was. best.safetensors is renamed first: a crash between the
  // renames leaves it ahead of the epoch checkpoints, and the epoch, trained again, writes it again.
  io::StagedFiles files;
  std::vector<std::string> written;
  try {
    if (best) written.push_back(save_best(engine, st, &files));
    if (due) {
      written.push_back((fs::path(dir_) / epoch_file(st.epoch)).string());
      save_checkpoint(written.back(), engine, &opt, st, &files);
    }
    commit(files);
  } catch (...) {
    st.best_test_acc = best_before;
    throw;
  }
  if (due) rotate(written.back());
  return written;
}

std::string CheckpointSaver::save_if_best(Engine& engine, CheckpointState& st) {
  if (!(st.score > st.best_test_acc)) return "";
  const double before = st.best_test_acc;
  st.best_test_acc = st.score;
  try {
    io::StagedFiles files;
    const std::string p = save_best(engine, st, &files);
    commit(files);
    return p;
  } catch (...) {
    st.best_test_acc = before;  // not recorded as written
    throw;
  }
}

std::string CheckpointSaver::save_best(Engine& engine, const CheckpointState& st, io::StagedFiles* staged) {
  const std::string p = (fs::path(dir_) / "best.safetensors").string();
  save_checkpoint(p, engine, nullptr, st, staged);  // the model alone: the file people deploy
  return p;
}

}  // namespace fanout::train
