// The transformer block of GPT-2 as nanoGPT writes it. MLP: c_fc (E -> 4E),
// GELU (exact), c_proj (4E -> E), dropout. Block (pre-LayerNorm residual):
// x + attn(ln_1(x)), then + mlp(ln_2(x)). LayerNorms over E, with or without
// bias as the linears. Input and output (B, T, E).
#pragma once
#include "models/layers/attention.h"
#include "models/layers/layernorm.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class MLP : public Module {
 public:
  MLP(int64_t n_embd, float dropout = 0.0f, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "MLP"; }
  void set_input_grad(bool on) override;
  void set_dropout_salt(uint64_t salt) { dropout_->set_salt(salt); }

 private:
  int64_t n_embd_;
  float p_;
  bool bias_;
  Module* c_fc_;
  Module* gelu_;
  Module* c_proj_;
  Dropout* dropout_;
};

class Block : public Module {
 public:
  // One-line error when n_embd is not a multiple of n_head.
  Block(int64_t n_embd, int64_t n_head, float dropout = 0.0f, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override;
  std::string type_name() const override { return "Block"; }
  void set_input_grad(bool on) override;
  // Salts of the block's three dropout masks: salt, salt + 1, salt + 2.
  void set_dropout_salt(uint64_t salt);

 private:
  int64_t n_embd_, n_head_;
  float p_;
  bool bias_;
  uint64_t salt_ = 0;
  LayerNorm* ln_1_;
  CausalSelfAttention* attn_;
  LayerNorm* ln_2_;
  MLP* mlp_;
  Tensor x1_, x2_, g_, dx_;  // x + attn(...), x1 + mlp(...); a copy of the incoming gradient; dx
};

}  // namespace fanout::models
