// Optimizer base: groups, chunk tables, state arenas, float64 rounding;
// and the factory.
#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "runtime/core/error.h"
#include "runtime/optim/adam.h"
#include "runtime/optim/sgd.h"

namespace fanout::optim {

OptimizerKind parse_optimizer(const std::string& s) {
  if (s == "sgd") return OptimizerKind::SGD;
  if (s == "adam") return OptimizerKind::Adam;
  if (s == "adamw") return OptimizerKind::AdamW;
  FANOUT_FAIL() << "unknown optimizer '" << s << "' (expected sgd, adam or adamw)";
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::SGD: return "SGD";
    case OptimizerKind::Adam: return "Adam";
    case OptimizerKind::AdamW: return "AdamW";
  }
  return "?";
}

namespace {

// The group's parameter ranges, merged across alignment padding, cut into
// chunks of at most kUpdateChunk elements: (K, 2) int64 on the host.
Tensor chunk_table(const std::vector<std::pair<int64_t, int64_t>>& ranges_in) {
  std::vector<std::pair<int64_t, int64_t>> ranges = ranges_in;  // [begin, end)
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& r : ranges) {
    if (r.second <= r.first) continue;
    if (!merged.empty() && r.first - merged.back().second < kArenaAlign)
      merged.back().second = std::max(merged.back().second, r.second);  // only padding between
    else
      merged.push_back(r);
  }
  std::vector<int64_t> pairs;
  for (const auto& [b, e] : merged)
    for (int64_t s = b; s < e; s += kernels::kUpdateChunk) {
      pairs.push_back(s);
      pairs.push_back(std::min(kernels::kUpdateChunk, e - s));
    }
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(pairs.size() / 2), 2}, DType::I64, Device::cpu());
  std::copy(pairs.begin(), pairs.end(), t.data<int64_t>());
  return t;
}

}  // namespace

Optimizer::Optimizer(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups)
    : model_(model), ctx_(ctx), o_(o), lr_(o.lr), groups_(std::move(groups)) {
  FANOUT_CHECK(model.materialized()) << "the optimizer needs a materialized model (call init() or materialize())";
  const int64_t arena = model.arenas().params.numel();
  begin_ = o.range.begin;
  end_ = o.range.end < 0 ? arena : o.range.end;
  FANOUT_CHECK(begin_ >= 0 && begin_ <= end_ && end_ <= arena)
      << "optimizer range [" << begin_ << ", " << end_ << ") outside the arena of " << arena;
  FANOUT_CHECK(model.device().same_memory(ctx.device()))
      << "the model is on " << model.device().str() << " but the optimizer's context on " << ctx.device().str();
  auto params = model.named_parameters();
  std::map<std::string, Parameter*> by_name(params.begin(), params.end());
  std::set<std::string> taken;
  for (const ParamGroup& g : groups_) {
    FANOUT_USER_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0)
        << "invalid weight decay " << g.weight_decay << " for parameter group '" << g.name << "'";
    FANOUT_USER_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0)
        << "invalid learning-rate scale " << g.lr_scale << " for parameter group '" << g.name << "'";
    for (const std::string& n : g.params) {
      FANOUT_USER_CHECK(by_name.count(n)) << "parameter group '" << g.name << "' names " << n
                                          << ", which the model does not have";
      FANOUT_USER_CHECK(taken.insert(n).second) << "parameter " << n << " is in two parameter groups";
    }
  }
  ParamGroup rest{"default", {}, o.weight_decay, 1.0f};
  for (auto& [n, p] : params)
    if (!taken.count(n)) rest.params.push_back(n);
  if (!rest.params.empty()) groups_.insert(groups_.begin(), std::move(rest));
  for (const ParamGroup& g : groups_) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const std::string& n : g.params) {
      const Parameter* p = by_name.at(n);
      // The part of the parameter inside the range, relative to its start.
      const int64_t b = std::max(p->offset, begin_), e = std::min(p->offset + p->shape.numel(), end_);
      if (b < e) ranges.emplace_back(b - begin_, e - begin_);
    }
    Tensor table = chunk_table(ranges);
    chunks_.push_back({ctx.device().is_cpu() ? table : table.to(ctx.device()), g.weight_decay, g.lr_scale});
  }
  set_lr(o.lr);
}

void Optimizer::set_lr(float lr) {
  FANOUT_USER_CHECK(std::isfinite(lr) && lr >= 0) << "invalid learning rate " << lr;
  lr_ = lr;
}

void Optimizer::add_state(const std::string& name) {
  state_.emplace_back(name, Tensor::zeros(Shape{end_ - begin_}, DType::F32, model_.device()));
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  if (steps_ == 0) return out;
  for (auto& [n, t] : state_) out.emplace_back(n, &t);
  return out;
}

std::vector<int64_t> Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& [n, t] : state_) b += static_cast<int64_t>(t.nbytes());
  return {b};
}

std::vector<std::string> Optimizer::state_names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : state_) out.push_back(n);
  return out;
}

Tensor Optimizer::params() { return model_.arenas().params.flat(begin_, Shape{end_ - begin_}); }

Tensor& Optimizer::grads_for_step() {
  Tensor& all = model_.arenas().grads;
  grads_ = all.flat(begin_, Shape{end_ - begin_});
  if (all.dtype() != DType::F64) return grads_;
  if (!rounded_) {
    FANOUT_CHECK(all.device().is_cpu()) << "float64 gradients on " << all.device().str();
    ensure(grad32_, grads_.shape(), DType::F32, all.device());
    const double* src = grads_.f64();
    float* dst = grad32_.f32();
    for (int64_t i = 0; i < grads_.numel(); ++i) dst[i] = static_cast<float>(src[i]);
    rounded_ = true;
  }
  return grad32_;
}

double Optimizer::grad_sum_squares() { return kernels::sum_squares(ctx_, grads_for_step()); }
void Optimizer::scale_grads(float a) { kernels::scale(ctx_, a, grads_for_step()); }
void Optimizer::clamp_grads(float limit) { kernels::clamp_abs(ctx_, grads_for_step(), limit); }

void Optimizer::step() {
  const Tensor& g = grads_for_step();
  for (const Group& c : chunks_) update(g, c);
  rounded_ = false;
  ++steps_;
}

void Optimizer::zero_grad() {
  Tensor& all = model_.arenas().grads;
  if (begin_ == 0 && end_ == all.numel())
    all.zero(&ctx_.compute());
  else
    all.flat(begin_, Shape{end_ - begin_}).zero(&ctx_.compute());
  rounded_ = false;
  ctx_.compute().synchronize();
}

nlohmann::json Optimizer::hyper() const {
  nlohmann::json j = {{"type", type()}, {"weight_decay", o_.weight_decay}};
  if (o_.kind == OptimizerKind::SGD) {
    j["momentum"] = o_.momentum;
    j["dampening"] = o_.dampening;
    j["nesterov"] = o_.nesterov;
  } else {
    j["betas"] = {o_.beta1, o_.beta2};
    j["eps"] = o_.eps;
    j["amsgrad"] = o_.amsgrad;
  }
  nlohmann::json gs = nlohmann::json::array();
  for (const ParamGroup& g : groups_)
    gs.push_back({{"name", g.name}, {"weight_decay", g.weight_decay}, {"lr_scale", g.lr_scale}, {"params", g.params.size()}});
  j["groups"] = gs;
  return j;
}

std::vector<std::string> no_decay_params(Module& model) {
  std::vector<std::string> out;
  for (auto& [n, p] : model.named_parameters()) {
    const bool bias = n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    if (bias || n == "bias" || p->shape.ndim <= 1) out.push_back(n);
  }
  return out;
}

std::vector<ParamGroup> resolve_groups(Module& model, const OptimizerOptions& o, std::vector<ParamGroup> groups) {
  if (groups.empty() && o.no_decay_norm_bias) {
    std::vector<std::string> nd = no_decay_params(model);
    if (!nd.empty()) groups.push_back({"no_decay", std::move(nd), 0.0f, 1.0f});
  }
  return groups;
}

std::unique_ptr<Optimizer> make_optimizer(Module& model, Context& ctx, const OptimizerOptions& o,
                                          std::vector<ParamGroup> groups) {
  FANOUT_USER_CHECK(std::isfinite(o.lr) && o.lr >= 0) << "invalid learning rate " << o.lr << " (must be >= 0)";
  FANOUT_USER_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0)
      << "invalid weight decay " << o.weight_decay << " (must be >= 0)";
  if (o.kind == OptimizerKind::SGD) {
    FANOUT_USER_CHECK(std::isfinite(o.momentum) && o.momentum >= 0)
        << "invalid momentum " << o.momentum << " (must be >= 0)";
    FANOUT_USER_CHECK(std::isfinite(o.dampening)) << "invalid dampening " << o.dampening;
    FANOUT_USER_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0))
        << "Nesterov momentum requires a momentum and zero dampening";
    FANOUT_USER_CHECK(!o.amsgrad) << "amsgrad applies to Adam and AdamW, not SGD";
  } else {
    FANOUT_USER_CHECK(std::isfinite(o.eps) && o.eps >= 0) << "invalid epsilon " << o.eps << " (must be >= 0)";
    FANOUT_USER_CHECK(o.beta1 >= 0 && o.beta1 < 1) << "invalid beta1 " << o.beta1 << " (must be in [0, 1))";
    FANOUT_USER_CHECK(o.beta2 >= 0 && o.beta2 < 1) << "invalid beta2 " << o.beta2 << " (must be in [0, 1))";
    FANOUT_USER_CHECK(!o.nesterov) << "Nesterov momentum applies to SGD, not " << optimizer_name(o.kind);
  }
  groups = resolve_groups(model, o, std::move(groups));
  if (o.kind == OptimizerKind::SGD) return std::make_unique<SGD>(model, ctx, o, std::move(groups));
  return std::make_unique<Adam>(model, ctx, o, std::move(groups));
}

}  // namespace fanout::optim
