// CausalSelfAttention as nanoGPT writes it: one linear c_attn (E -> 3E) gives
// q, k and v, split into n_head heads of E / n_head features; causal scaled
// dot-product attention per head (scale 1 / sqrt(head size)); heads joined
// and projected by c_proj (E -> E); dropout p on the attention probabilities
// and on the output (resid_dropout) in training. Input and output (B, T, E).
//
// Without attention dropout (p = 0, or evaluation) attention is one fused
// kernel (kernels/attention.h: no T x T matrix kept). With it, the
// probabilities are materialized ((B, H, T, T): batched products and the
// causal softmax, kernels/gemm.h and kernels/softmax.h) so that the dropped
// ones can be, as torch's scaled_dot_product_attention(dropout_p) does.
//
// Generation keeps a key-value cache (evaluation only): after
// start_cache(B, L), a forward with use_cache(true) takes the (B, T) tokens
// that follow those it has seen since (positions [cached(), cached() + T),
// at most L in all), appends their keys and values to the cache and attends
// over all of them (kernels::attention_decode; the first tokens, among
// themselves, through kernels::attention_forward). The plain forward, with
// use_cache(false), neither reads nor changes the cache.
#pragma once
#include "models/layers/dropout.h"
#include "models/layers/linear.h"
#include "runtime/nn/module.h"

namespace fanout::models {

class CausalSelfAttention : public Module {
 public:
  // One-line error when n_embd is not a multiple of n_head.
  CausalSelfAttention(int64_t n_embd, int64_t n_head, float dropout = 0.0f, bool bias = true);
  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override {
    auto m = std::make_unique<CausalSelfAttention>(n_embd_, n_head_, p_, bias_);
    m->set_dropout_salt(salt_);
    return m;
  }
  std::string type_name() const override { return "CausalSelfAttention"; }
  void set_input_grad(bool on) override;
  // Salts of the two dropout masks (Dropout::set_salt): salt and salt + 1.
  void set_dropout_salt(uint64_t salt);
  // The cache (B, H, L, D) of each of k and v, in the heads' storage type, starts empty.
  void start_cache(int64_t batch, int64_t max_len);
  void stop_cache();  // frees it
  void use_cache(bool on) { use_cache_ = on; }
  int64_t cached() const { return cached_; }
  Linear& c_attn() { return *c_attn_; }
  Linear& c_proj() { return *c_proj_; }

 private:
  void fused_forward(Context& ctx, float scale);
  void dropout_forward(Context& ctx, float scale);
  void dropout_backward(Context& ctx, float scale);
  Tensor cached_forward(const Tensor& x, Context& ctx);

  int64_t n_embd_, n_head_;
  float p_;
  bool bias_;
  Linear* c_attn_;
  Linear* c_proj_;
  Dropout* resid_dropout_;
  uint64_t salt_ = 0, key_ = 0;
  int64_t row_ = 0, row_stride_ = 1;
  bool dropped_ = false;  // the last forward dropped attention probabilities
  Shape x_shape_;
  Tensor qkv32_;                           // c_attn's low-type output as float32 (the dropout path)
  Tensor q_, k_, v_, yh_, lse_, y_;        // heads (B, H, T, D), lse (B, H, T), y (B, T, E)
  Tensor probs_, dropped_probs_, dprobs_;  // (B, H, T, T), with attention dropout only
  Tensor dyh_, dq_, dk_, dv_, dqkv_;
  Tensor k_cache_, v_cache_;  // (B, H, L, D)
  int64_t cache_batch_ = 0, cache_len_ = 0, cached_ = 0;
  bool use_cache_ = false;
};

}  // namespace fanout::models
