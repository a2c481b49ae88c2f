// Sequential container.
#include "models/layers/sequential.h"

#include "models/layers/activation.h"
#include "models/layers/batchnorm.h"
#include "runtime/core/error.h"

namespace fanout::models {

namespace {
// A batch norm whose output goes straight into an in-place ReLU (whose
// backward writes over its output gradient, as the fused one does): the two
// run as one (BatchNormNd::forward_add_relu); null otherwise.
BatchNormNd* bn_before_relu(const std::vector<std::pair<std::string, std::unique_ptr<Module>>>& ch, size_t i) {
  if (i + 1 >= ch.size()) return nullptr;
  const auto* relu = dynamic_cast<const ReLU*>(ch[i + 1].second.get());
  if (!relu || !relu->inplace()) return nullptr;
  return dynamic_cast<BatchNormNd*>(ch[i].second.get());
}
}  // namespace

Tensor Sequential::forward(const Tensor& x, Context& ctx) {
  Tensor h = x;
  auto& ch = children();
  relu_done_.assign(ch.size(), false);
  for (size_t i = 0; i < ch.size(); ++i) {
    if (BatchNormNd* bn = bn_before_relu(ch, i)) {
      h = bn->forward_add_relu(h, nullptr, ctx);
      relu_done_[++i] = true;  // the ReLU's part is done
      continue;
    }
    h = ch[i].second->forward(h, ctx);
  }
  return h;
}

Tensor Sequential::backward(const Tensor& dy, Context& ctx) {
  Tensor g = dy;
  auto& ch = children();
  FANOUT_CHECK(relu_done_.size() == ch.size()) << "Sequential backward before its forward";
  for (size_t i = ch.size(); i-- > 0;) {
    if (relu_done_[i]) continue;  // the batch norm before it takes the ReLU's backward
    g = backward_of(*ch[i].second, ch[i].first, g, ctx);
    if (!g.defined()) break;  // the children before it hold no parameters and need no gradient
  }
  return g;
}

std::unique_ptr<Module> Sequential::make_like() const {
  auto s = std::make_unique<Sequential>();
  for (auto& [n, c] : children()) s->add(n, c->make_like());
  s->set_input_grad(input_grad());
  return s;
}

void Sequential::set_input_grad(bool on) {
  Module::set_input_grad(on);
  // A child's input needs a gradient when this container's does or an
  // earlier child holds parameters: a model that starts with Flatten does
  // not compute its first linear layer's input gradient.
  bool need = on;
  for (auto& [n, c] : children()) {
    c->set_input_grad(need);
    need = need || !c->named_parameters().empty();
  }
}

Tensor ModuleDict::forward(const Tensor&, Context&) {
  FANOUT_FAIL() << "ModuleDict has no forward: the module that owns it calls its modules";
}

Tensor ModuleDict::backward(const Tensor&, Context&) {
  FANOUT_FAIL() << "ModuleDict has no backward: the module that owns it calls its modules";
}

std::unique_ptr<Module> ModuleDict::make_like() const {
  auto d = std::make_unique<ModuleDict>();
  for (auto& [n, c] : children()) d->add(n, c->make_like());
  return d;
}

}  // namespace fanout::models
