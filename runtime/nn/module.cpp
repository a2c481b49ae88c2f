// Module tree: registration, naming, arenas, cloning.
#include "runtime/nn/module.h"

#include "runtime/core/error.h"

#include <atomic>
#include <set>

namespace fanout {

namespace {
std::atomic<uint64_t> g_constructed{0};
}

Module::Module() { ++g_constructed; }
uint64_t Module::constructed() { return g_constructed.load(); }

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::set_batch_stat_sync(BatchStatSync* s) {
  for (auto& [n, c] : children_) c->set_batch_stat_sync(s);
}

BatchStatSync* Module::batch_stat_sync() const {
  for (auto& [n, c] : children_)
    if (BatchStatSync* s = c->batch_stat_sync()) return s;
  return nullptr;
}

Parameter& Module::register_parameter(const std::string& name, const Shape& s) {
  FANOUT_CHECK(!arenas_) << "register_parameter after materialize";
  params_.push_back(Parameter{name, s, {}, {}, 0});
  return params_.back();
}

Buffer& Module::register_buffer(const std::string& name, const Shape& s, DType t) {
  FANOUT_CHECK(!arenas_) << "register_buffer after materialize";
  buffers_.push_back(Buffer{name, s, t, {}, 0});
  return buffers_.back();
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>* ps,
                     std::vector<std::pair<std::string, Buffer*>>* bs, std::vector<std::pair<std::string, Tensor>>* sd,
                     std::vector<std::pair<std::string, Module*>>* ms) {
  if (ms) ms->emplace_back(prefix, this);
  const std::string dot = prefix.empty() ? "" : prefix + ".";
  for (auto& p : params_) {
    if (ps) ps->emplace_back(dot + p.name, &p);
    if (sd) sd->emplace_back(dot + p.name, p.value);
  }
  for (auto& b : buffers_) {
    if (bs) bs->emplace_back(dot + b.name, &b);
    if (sd) sd->emplace_back(dot + b.name, b.value);
  }
  // A child registered without a name (a wrapper's block) adds no level.
  for (auto& [n, c] : children_) c->collect(n.empty() ? prefix : dot + n, ps, bs, sd, ms);
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect("", &out, nullptr, nullptr, nullptr);
  return out;
}
std::vector<std::pair<std::string, Buffer*>> Module::named_buffers() {
  std::vector<std::pair<std::string, Buffer*>> out;
  collect("", nullptr, &out, nullptr, nullptr);
  return out;
}
std::vector<std::pair<std::string, Tensor>> Module::state_dict() {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", nullptr, nullptr, &out, nullptr);
  return out;
}
std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect("", nullptr, nullptr, nullptr, &out);
  return out;
}

void Module::materialize(Device d) {
  auto ps = named_parameters();
  auto bs = named_buffers();
  // Unnamed children add no level: two of them could give two tensors one name.
  std::set<std::string> names;
  for (auto& [n, p] : ps) FANOUT_USER_CHECK(names.insert(n).second) << "two parameters are named '" << n << "'";
  for (auto& [n, b] : bs) FANOUT_USER_CHECK(names.insert(n).second) << "two tensors are named '" << n << "'";
  int64_t p_total = 0, b_total = 0;
  for (auto& [n, p] : ps) {
    p->offset = p_total;
    p_total += (p->shape.numel() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  }
  for (auto& [n, b] : bs) {
    if (b->dtype != DType::F32) continue;
    b->offset = b_total;
    b_total += (b->shape.numel() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  }
  auto a = std::make_shared<Arenas>();
  a->params = Tensor::zeros(Shape{p_total}, DType::F32, d);
  a->grads = Tensor::zeros(Shape{p_total}, DType::F32, d);
  a->buffers = Tensor::zeros(Shape{b_total}, DType::F32, d);
  for (auto& [n, b] : bs)
    if (b->dtype != DType::F32) b->value = Tensor::zeros(b->shape, b->dtype, Device::cpu());
  bind(a);
}

Tensor Arenas::grad_range(int64_t begin, int64_t count) const {
  FANOUT_CHECK(begin >= grads_begin && count >= 0 && begin + count <= grads_begin + grads.numel())
      << "gradient elements [" << begin << ", " << begin + count << ") outside the gradient window ["
      << grads_begin << ", " << grads_begin + grads.numel() << ")";
  return grads.flat(begin - grads_begin, Shape{count});
}

void Module::bind(const std::shared_ptr<Arenas>& a) {
  arenas_ = a;
  const int64_t gb = a->grads_begin, ge = gb + a->grads.numel();
  for (auto& p : params_) {
    p.value = a->params.flat(p.offset, p.shape);
    const bool inside = p.offset >= gb && p.offset + p.shape.numel() <= ge;
    p.grad = inside ? a->grads.flat(p.offset - gb, p.shape) : Tensor();
  }
  for (auto& b : buffers_)
    if (b.dtype == DType::F32) b.value = a->buffers.flat(b.offset, b.shape);
  for (auto& [n, c] : children_) c->bind(a);
}

void Module::init_tree(std::mt19937_64& rng) {
  reset_parameters(rng);
  for (auto& [n, c] : children_) c->init_tree(rng);
  finish_init(rng);
}

void Module::init(uint64_t seed) {
  materialize(Device::cpu());
  std::mt19937_64 rng(seed);
  init_tree(rng);
}

void Module::to(Device d, Stream* s) {
  FANOUT_USER_CHECK(arenas_) << type_name() << "::to(): the module has no parameters in memory yet; call "
                                  "init(seed) first (it materializes them on the CPU)";
  if (arenas_->params.device() == d) return;
  auto a = std::make_shared<Arenas>();
  a->params = arenas_->params.to(d, s);
  a->grads = arenas_->grads.to(d, s);
  a->grads_begin = arenas_->grads_begin;
  a->buffers = arenas_->buffers.to(d, s);
  bind(a);
}

std::unique_ptr<Module> Module::clone(Device d, Stream* s) const {
  FANOUT_USER_CHECK(arenas_) << type_name() << "::clone(): the module has no parameters in memory yet; call "
                                  "init(seed) first (it materializes them on the CPU)";
  std::unique_ptr<Module> m = make_like();
  {  // a replica's parameters and buffers are this module's, by name and shape
    auto mine = const_cast<Module*>(this)->named_parameters(), theirs = m->named_parameters();
    auto mine_b = const_cast<Module*>(this)->named_buffers(), theirs_b = m->named_buffers();
    bool same = mine.size() == theirs.size() && mine_b.size() == theirs_b.size();
    for (size_t i = 0; same && i < mine.size(); ++i)
      same = mine[i].first == theirs[i].first && mine[i].second->shape == theirs[i].second->shape;
    for (size_t i = 0; same && i < mine_b.size(); ++i)
      same = mine_b[i].first == theirs_b[i].first && mine_b[i].second->shape == theirs_b[i].second->shape;
    FANOUT_USER_CHECK(same) << type_name() << "::make_like() made a module with other parameters or buffers (names "
                            << "or shapes) than the one it copies: it must build the same architecture";
  }
  m->materialize(d);
  if (grad_dtype() != DType::F32) m->set_grad_dtype(grad_dtype());
  if (arenas_->grads.numel() != arenas_->params.numel())
    m->set_grad_window(arenas_->grads_begin, arenas_->grads_begin + arenas_->grads.numel());
  m->arenas_->params.copy_from(arenas_->params, s);
  m->arenas_->grads.copy_from(arenas_->grads, s);
  m->arenas_->buffers.copy_from(arenas_->buffers, s);
  // Non-float buffers (num_batches_tracked) live on the host.
  auto src = const_cast<Module*>(this)->named_buffers();
  auto dst = m->named_buffers();
  for (size_t i = 0; i < src.size(); ++i)
    if (src[i].second->dtype != DType::F32) dst[i].second->value.copy_from(src[i].second->value);
  m->train(training_);
  m->set_input_grad(input_grad_);
  return m;
}

void Module::share_params(const Module& from) {
  FANOUT_CHECK(arenas_ && from.arenas_) << "share_params() before materialize";
  FANOUT_CHECK(from.arenas_->params.numel() == arenas_->params.numel() &&
               from.arenas_->params.device().same_memory(arenas_->params.device()))
      << "share_params(): another layout or memory";
  auto a = std::make_shared<Arenas>(*arenas_);
  a->params = from.arenas_->params.seen_from(arenas_->params.device());
  bind(a);
}

bool Module::shares_params_with(const Module& from) const {
  return arenas_ && from.arenas_ && arenas_->params.raw() == from.arenas_->params.raw();
}

Device Module::device() const {
  FANOUT_USER_CHECK(arenas_) << type_name() << "::device(): the module has no parameters in memory yet; call "
                                  "init(seed) first (it materializes them on the CPU)";
  return arenas_->params.device();
}

Arenas& Module::arenas() {
  FANOUT_USER_CHECK(arenas_) << type_name() << "::arenas(): the module has no parameters in memory yet; call "
                                  "init(seed) first (it materializes them on the CPU)";
  return *arenas_;
}
const Arenas& Module::arenas() const {
  FANOUT_USER_CHECK(arenas_) << type_name() << "::arenas(): the module has no parameters in memory yet; call "
                                  "init(seed) first (it materializes them on the CPU)";
  return *arenas_;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& p : const_cast<Module*>(this)->named_parameters()) n += p.second->shape.numel();
  return n;
}

void Module::zero_grad(Stream* s) { arenas().grads.zero(s); }

void Module::set_grad_dtype(DType t) {
  FANOUT_CHECK(arenas_) << "set_grad_dtype() before materialize";
  FANOUT_CHECK(t == DType::F32 || t == DType::F64) << "gradients must be float32 or float64, not " << dtype_name(t);
  FANOUT_USER_CHECK(t == DType::F32 || device().is_cpu())
      << "float64 gradients are supported on CPU devices only, the model is on " << device().str();
  if (arenas_->grads.dtype() == t) return;
  auto a = std::make_shared<Arenas>(*arenas_);
  a->grads = Tensor::zeros(arenas_->grads.shape(), t, device());
  bind(a);
}

void Module::set_grad_window(int64_t begin, int64_t end) {
  FANOUT_CHECK(arenas_) << "set_grad_window() before materialize";
  FANOUT_CHECK(begin >= 0 && begin <= end && end <= arenas_->params.numel())
      << "gradient window [" << begin << ", " << end << ") outside the arena of " << arenas_->params.numel();
  auto a = std::make_shared<Arenas>(*arenas_);
  a->grads = Tensor::zeros(Shape{end - begin}, arenas_->grads.dtype(), device());
  a->grads_begin = begin;
  bind(a);
}

void Module::notify_grads_ready(Context& ctx) const {
  notified_ = true;
  if (params_.empty()) return;
  const int64_t begin = params_.front().offset;
  const int64_t end = params_.back().offset + params_.back().shape.numel();
  ctx.grad_ready(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

Tensor Module::backward_of(Module& m, const std::string& name, const Tensor& dy, Context& ctx) {
  m.notified_ = false;
  if (!m.params_.empty()) {
    const int64_t begin = m.params_.front().offset;
    const int64_t end = m.params_.back().offset + m.params_.back().shape.numel();
    ctx.grad_write(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  }
  Tensor g = m.backward(dy, ctx);
  FANOUT_USER_CHECK(m.params_.empty() || m.notified_)
      << "layer '" << name << "' (" << m.type_name() << ") has parameters but its backward did not call "
      << "notify_grads_ready(ctx); a layer calls it once its parameters' gradients are final (README: Writing a layer)";
  return g;
}

}  // namespace fanout
