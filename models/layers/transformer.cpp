// MLP and Block layers.
#include "models/layers/transformer.h"

#include "kernels/elementwise.h"
#include "models/layers/smooth_activation.h"
#include "runtime/core/error.h"

namespace fanout::models {

MLP::MLP(int64_t n_embd, float dropout, bool bias) : n_embd_(n_embd), p_(dropout), bias_(bias) {
  c_fc_ = &register_module("c_fc", std::make_unique<Linear>(n_embd, 4 * n_embd, bias));
  gelu_ = &register_module("gelu", GELU());
  c_proj_ = &register_module("c_proj", std::make_unique<Linear>(4 * n_embd, n_embd, bias));
  dropout_ = &register_module("dropout", std::make_unique<Dropout>(dropout));
}

std::unique_ptr<Module> MLP::make_like() const {
  auto m = std::make_unique<MLP>(n_embd_, p_, bias_);
  m->set_dropout_salt(dropout_->salt());
  return m;
}

void MLP::set_input_grad(bool on) {
  Module::set_input_grad(on);
  c_fc_->set_input_grad(on);
}

Tensor MLP::forward(const Tensor& x, Context& ctx) {
  Tensor h = c_fc_->forward(x, ctx);
  h = gelu_->forward(h, ctx);
  h = c_proj_->forward(h, ctx);
  return dropout_->forward(h, ctx);
}

Tensor MLP::backward(const Tensor& dy, Context& ctx) {
  Tensor g = Module::backward_of(*dropout_, "dropout", dy, ctx);
  g = Module::backward_of(*c_proj_, "c_proj", g, ctx);
  g = Module::backward_of(*gelu_, "gelu", g, ctx);
  return Module::backward_of(*c_fc_, "c_fc", g, ctx);
}

Block::Block(int64_t n_embd, int64_t n_head, float dropout, bool bias)
    : n_embd_(n_embd), n_head_(n_head), p_(dropout), bias_(bias) {
  ln_1_ = &register_module("ln_1", std::make_unique<LayerNorm>(Shape{n_embd}, 1e-5f, true, bias));
  attn_ = &register_module("attn", std::make_unique<CausalSelfAttention>(n_embd, n_head, dropout, bias));
  ln_2_ = &register_module("ln_2", std::make_unique<LayerNorm>(Shape{n_embd}, 1e-5f, true, bias));
  mlp_ = &register_module("mlp", std::make_unique<MLP>(n_embd, dropout, bias));
}

std::unique_ptr<Module> Block::make_like() const {
  auto m = std::make_unique<Block>(n_embd_, n_head_, p_, bias_);
  m->set_dropout_salt(salt_);
  return m;
}

void Block::set_input_grad(bool on) {
  Module::set_input_grad(on);
  ln_1_->set_input_grad(on);
}

void Block::set_dropout_salt(uint64_t salt) {
  salt_ = salt;
  attn_->set_dropout_salt(salt);
  mlp_->set_dropout_salt(salt + 2);
}

Tensor Block::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 3 && x.size(2) == n_embd_)
      << "Block(n_embd " << n_embd_ << ") cannot take input of shape " << x.shape().str();
  ensure(x1_, x.shape(), ctx);
  ensure(x2_, x.shape(), ctx);
  kernels::add(ctx, x, attn_->forward(ln_1_->forward(x, ctx), ctx), x1_);
  kernels::add(ctx, x1_, mlp_->forward(ln_2_->forward(x1_, ctx), ctx), x2_);
  return x2_;
}

Tensor Block::backward(const Tensor& dy, Context& ctx) {
  // The residual carries dy past each branch; the branches may overwrite
  // the gradient they are given, so each gets its own copy.
  ensure(g_, dy.shape(), ctx);
  ensure(dx_, dy.shape(), ctx);
  g_.copy_from(dy, &ctx.compute());
  Tensor branch = Module::backward_of(*mlp_, "mlp", g_, ctx);
  branch = Module::backward_of(*ln_2_, "ln_2", branch, ctx);
  kernels::add(ctx, dy, branch, dx_);  // d(x1)
  g_.copy_from(dx_, &ctx.compute());
  branch = Module::backward_of(*attn_, "attn", g_, ctx);
  branch = Module::backward_of(*ln_1_, "ln_1", branch, ctx);  // its parameters' gradients either way
  if (!input_grad()) return Tensor();
  kernels::add(ctx, dx_, branch, dx_);
  return dx_;
}

}  // namespace fanout::models
