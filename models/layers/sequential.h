// Sequential container: children run in the order they were added; names are
// the child names given (torch's Sequential uses "0", "1", ...). A BatchNorm
// followed by an in-place ReLU runs as one (BatchNormNd::forward_add_relu): the same
// values, one pass fewer; the ReLU module's own forward is not called. ModuleDict
// (torch.nn.ModuleDict): named children and no forward of its own; the
// module that owns it calls them (GPT's "transformer").
#pragma once
#include "runtime/nn/module.h"

namespace fanout::models {

class Sequential : public Module {
 public:
  Sequential() = default;
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  template <class M>
  M& add(std::unique_ptr<M> m) {
    return register_module(std::to_string(children().size()), std::move(m));
  }
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "Sequential"; }
  void set_input_grad(bool on) override;
  size_t size() const { return children().size(); }
  Module& at(size_t i) { return *children()[i].second; }

 private:
  std::vector<bool> relu_done_;  // per child: a ReLU run by the batch norm before it in the last forward
};

class ModuleDict : public Module {
 public:
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  // One-line error: the owner runs the children.
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "ModuleDict"; }
};

}  // namespace fanout::models
