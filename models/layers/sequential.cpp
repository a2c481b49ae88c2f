// Sequential container.
#include "models/layers/sequential.h"

namespace fanout::models {

Tensor Sequential::forward(const Tensor& x, Context& ctx) {
  Tensor h = x;
  for (auto& [n, c] : children()) h = c->forward(h, ctx);
  return h;
}

Tensor Sequential::backward(const Tensor& dy, Context& ctx) {
  Tensor g = dy;
  auto& ch = children();
  for (size_t i = ch.size(); i-- > 0;) g = backward_of(*ch[i].second, ch[i].first, g, ctx);
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
  auto& ch = children();
  for (size_t i = 0; i < ch.size(); ++i) ch[i].second->set_input_grad(i == 0 ? on : true);
}

}  // namespace fanout::models
