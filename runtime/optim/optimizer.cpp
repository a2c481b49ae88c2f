// Optimizer base: groups, chunk tables, state arenas, float64 rounding;
// and the factory.
#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>

#include "kernels/elementwise.h"
#include "kernels/optim.h"
#include "runtime/core/error.h"
#include "runtime/optim/adam.h"
#include "runtime/optim/sgd.h"

namespace fanout::optim {

namespace {

using Make = std::unique_ptr<Optimizer> (*)(Module&, Context&, const OptimizerOptions&, std::vector<ParamGroup>);
template <class T>
std::unique_ptr<Optimizer> make(Module& m, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> g) {
  return std::make_unique<T>(m, ctx, o, std::move(g));
}
struct KindEntry {
  OptimizerKind kind;
  const char* flag;   // --optimizer
  const char* torch;  // torch.optim's class
  Make make;
};
constexpr KindEntry kKinds[] = {
    {OptimizerKind::SGD, "sgd", "SGD", make<SGD>},
    {OptimizerKind::Adam, "adam", "Adam", make<Adam>},
    {OptimizerKind::AdamW, "adamw", "AdamW", make<Adam>},
};

const KindEntry& entry(OptimizerKind k) {
  for (const KindEntry& e : kKinds)
    if (e.kind == k) return e;
  FANOUT_FAIL() << "optimizer kind " << static_cast<int>(k) << " is not in the optimizer table";
}

}  // namespace

OptimizerKind parse_optimizer(const std::string& s) {
  std::string known;
  const size_t n = std::size(kKinds);
  for (size_t i = 0; i < n; ++i) {
    if (s == kKinds[i].flag) return kKinds[i].kind;
    known.append(i == 0 ? "" : i + 1 < n ? ", " : " or ").append(kKinds[i].flag);
  }
  FANOUT_FAIL() << "unknown optimizer '" << s << "' (expected " << known << ")";
}

const char* optimizer_name(OptimizerKind k) { return entry(k).torch; }

std::vector<std::string> optimizer_names() {
  std::vector<std::string> out;
  for (const KindEntry& e : kKinds) out.push_back(e.flag);
  return out;
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

std::vector<ParamGroup> complete_groups(Module& model, const OptimizerOptions& o, std::vector<ParamGroup> groups) {
  auto params = model.named_parameters();
  std::set<std::string> names, taken, group_names;
  for (auto& [n, p] : params) names.insert(n);
  for (const ParamGroup& g : groups) {
    FANOUT_USER_CHECK(group_names.insert(g.name).second) << "two parameter groups are named '" << g.name << "'";
    FANOUT_USER_CHECK(std::isfinite(g.weight_decay) && g.weight_decay >= 0)
        << "invalid weight decay " << g.weight_decay << " for parameter group '" << g.name << "'";
    FANOUT_USER_CHECK(std::isfinite(g.lr_scale) && g.lr_scale >= 0)
        << "invalid learning-rate scale " << g.lr_scale << " for parameter group '" << g.name << "'";
    for (const std::string& n : g.params) {
      FANOUT_USER_CHECK(names.count(n)) << "parameter group '" << g.name << "' names " << n
                                        << ", which the model does not have";
      FANOUT_USER_CHECK(taken.insert(n).second) << "parameter " << n << " is in two parameter groups";
    }
  }
  ParamGroup rest{"default", {}, o.weight_decay, 1.0f};
  for (auto& [n, p] : params)
    if (!taken.count(n)) rest.params.push_back(n);
  FANOUT_USER_CHECK(rest.params.empty() || !group_names.count(rest.name))
      << "parameter group 'default' leaves parameters out, and 'default' names the group of the parameters no "
         "group names: list every parameter in the groups, or name it otherwise";
  if (!rest.params.empty()) groups.insert(groups.begin(), std::move(rest));
  return groups;
}

Optimizer::Optimizer(const OptimizerOptions& o, std::vector<ParamGroup> groups)
    : o_(o), lr_(o.lr), groups_(std::move(groups)) {
  set_lr(o.lr);
}

ArenaOptimizer::ArenaOptimizer(Module& model, Context& ctx, const OptimizerOptions& o, std::vector<ParamGroup> groups)
    : Optimizer(o, complete_groups(model, o, std::move(groups))), model_(model), ctx_(ctx), ctx_alive_(ctx.lifetime()) {
  FANOUT_CHECK(model.materialized()) << "the optimizer needs a materialized model (call init() or materialize())";
  const int64_t arena = model.arenas().params.numel();
  begin_ = o.range.begin;
  end_ = o.range.end < 0 ? arena : o.range.end;
  FANOUT_CHECK(begin_ >= 0 && begin_ <= end_ && end_ <= arena)
      << "optimizer range [" << begin_ << ", " << end_ << ") outside the arena of " << arena;
  const Arenas& a = model.arenas();
  FANOUT_USER_CHECK(begin_ >= a.grads_begin && end_ <= a.grads_begin + a.grads.numel())
      << "this model keeps the gradients of parameter elements [" << a.grads_begin << ", "
      << a.grads_begin + a.grads.numel() << ") alone (sharded gradients): step a sharded engine with "
         "train::make_engine_optimizer";
  FANOUT_CHECK(model.device().same_memory(ctx.device()))
      << "the model is on " << model.device().str() << " but the optimizer's context on " << ctx.device().str();
  auto params = model.named_parameters();
  std::map<std::string, Parameter*> by_name(params.begin(), params.end());
  for (const ParamGroup& g : Optimizer::groups()) {
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
}

void Optimizer::set_lr(float lr) {
  FANOUT_USER_CHECK(std::isfinite(lr) && lr >= 0) << "invalid learning rate " << lr;
  lr_ = lr;
}

void ArenaOptimizer::add_state(const std::string& name) {
  state_.emplace_back(name, Tensor::zeros(Shape{end_ - begin_}, DType::F32, model_.device()));
}

std::vector<std::pair<std::string, Tensor*>> ArenaOptimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  if (steps() == 0) return out;
  for (auto& [n, t] : state_) out.emplace_back(n, &t);
  return out;
}

std::vector<int64_t> ArenaOptimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& [n, t] : state_) b += static_cast<int64_t>(t.nbytes());
  return {b};
}

std::vector<std::string> ArenaOptimizer::state_names() const {
  std::vector<std::string> out;
  for (const auto& [n, t] : state_) out.push_back(n);
  return out;
}

Tensor ArenaOptimizer::params() { return model_.arenas().params.flat(begin_, Shape{end_ - begin_}); }

Tensor& ArenaOptimizer::grads_for_step() {
  const Arenas& a = model_.arenas();
  const Tensor& all = a.grads;
  grads_ = a.grad_range(begin_, end_ - begin_);
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

Context& ArenaOptimizer::context() {
  FANOUT_USER_CHECK(!ctx_alive_.expired())
      << "the optimizer's context is gone: an optimizer must not outlive the engine (or context) it was made with";
  return ctx_;
}

double ArenaOptimizer::grad_sum_squares() { return kernels::sum_squares(context(), grads_for_step()); }
void ArenaOptimizer::scale_grads(float a) { kernels::scale(context(), a, grads_for_step()); }
void ArenaOptimizer::clamp_grads(float limit) { kernels::clamp_abs(context(), grads_for_step(), limit); }

void ArenaOptimizer::step() {
  const Tensor& g = grads_for_step();
  for (const Group& c : chunks_) update(g, c);
  rounded_ = false;
  set_steps(steps() + 1);
}

void ArenaOptimizer::zero_grad() {
  Stream& s = context().compute();
  model_.arenas().grad_range(begin_, end_ - begin_).zero(&s);
  rounded_ = false;
  s.synchronize();
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
  for (const ParamGroup& g : groups())
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
  if (!o.no_decay_norm_bias) return groups;
  std::set<std::string> taken;
  for (const ParamGroup& g : groups) {
    FANOUT_USER_CHECK(g.name != "no_decay")
        << "parameter group 'no_decay' is the one no_decay_norm_bias makes: name yours otherwise, or leave the "
           "option off";
    taken.insert(g.params.begin(), g.params.end());
  }
  std::vector<std::string> nd;
  for (std::string& n : no_decay_params(model))
    if (!taken.count(n)) nd.push_back(std::move(n));
  if (!nd.empty()) groups.push_back({"no_decay", std::move(nd), 0.0f, 1.0f});
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
  return entry(o.kind).make(model, ctx, o, resolve_groups(model, o, std::move(groups)));
}

}  // namespace fanout::optim
