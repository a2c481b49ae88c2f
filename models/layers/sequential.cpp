// Sequential container.
#include "models/layers/sequential.h"

#include "runtime/core/error.h"

namespace fanout::models {

Tensor Sequential::forward(const Tensor& x, Context& ctx) {
  Tensor h = x;
  for (auto& [n, c] : children()) h = c->forward(h, ctx);
  return h;
}

Tensor Sequential::backward(const Tensor& dy, Context& ctx) {
  Tensor g = dy;
  auto& ch = children();
  for (size_t i = ch.size(); i-- > 0;) {
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
