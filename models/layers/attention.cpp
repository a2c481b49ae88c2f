// CausalSelfAttention layer.
#include "models/layers/attention.h"

#include <cmath>

#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/dropout.h"
#include "kernels/gemm.h"
#include "kernels/heads.h"
#include "kernels/softmax.h"
#include "runtime/core/error.h"
#include "runtime/core/splitmix.h"
#include "runtime/nn/autocast.h"

namespace fanout::models {

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head, float dropout, bool bias)
    : n_embd_(n_embd), n_head_(n_head), p_(dropout), bias_(bias) {
  FANOUT_USER_CHECK(n_embd >= 1 && n_head >= 1 && n_embd % n_head == 0)
      << "n_embd " << n_embd << " is not divisible by n_head " << n_head;
  FANOUT_USER_CHECK(std::isfinite(dropout) && dropout >= 0.0f && dropout < 1.0f)
      << "attention dropout must be in [0, 1), got " << dropout;
  c_attn_ = &register_module("c_attn", std::make_unique<Linear>(n_embd, 3 * n_embd, bias));
  c_proj_ = &register_module("c_proj", std::make_unique<Linear>(n_embd, n_embd, bias));
  resid_dropout_ = &register_module("resid_dropout", std::make_unique<Dropout>(dropout));
}

void CausalSelfAttention::set_input_grad(bool on) {
  Module::set_input_grad(on);
  c_attn_->set_input_grad(on);
}

void CausalSelfAttention::set_dropout_salt(uint64_t salt) {
  salt_ = salt;
  resid_dropout_->set_salt(salt + 1);
}

void CausalSelfAttention::fused_forward(Context& ctx, float scale) {
  kernels::attention_forward(ctx, q_, k_, v_, scale, yh_, lse_);
}

// probs = softmax(scale q k^T, causal), dropped out; yh = dropped probs v.
// Row-major products, one per (b, h): q, k, v, yh (T, D), probs (T, T).
void CausalSelfAttention::dropout_forward(Context& ctx, float scale) {
  const int64_t b = q_.size(0), h = q_.size(1), t = q_.size(2), d = q_.size(3), td = t * d, tt = t * t;
  ensure(probs_, Shape{b, h, t, t}, ctx);
  ensure(dropped_probs_, Shape{b, h, t, t}, ctx);
  kernels::gemm_strided_batched(ctx, false, true, t, t, d, scale, q_.f32(), d, td, k_.f32(), d, td, 0.0f,
                                probs_.f32(), t, tt, b * h);
  kernels::softmax_forward(ctx, probs_, /*causal=*/true, probs_);
  kernels::dropout(ctx, probs_, p_, key_, row_, row_stride_, dropped_probs_);
  kernels::gemm_strided_batched(ctx, false, false, t, d, t, 1.0f, dropped_probs_.f32(), t, tt, v_.f32(), d, td,
                                0.0f, yh_.f32(), d, td, b * h);
}

void CausalSelfAttention::dropout_backward(Context& ctx, float scale) {
  const int64_t b = q_.size(0), h = q_.size(1), t = q_.size(2), d = q_.size(3), td = t * d, tt = t * t;
  ensure(dprobs_, Shape{b, h, t, t}, ctx);
  // dv = dropped^T dyh; d(dropped) = dyh v^T.
  kernels::gemm_strided_batched(ctx, true, false, t, d, t, 1.0f, dropped_probs_.f32(), t, tt, dyh_.f32(), d, td,
                                0.0f, dv_.f32(), d, td, b * h);
  kernels::gemm_strided_batched(ctx, false, true, t, t, d, 1.0f, dyh_.f32(), d, td, v_.f32(), d, td, 0.0f,
                                dprobs_.f32(), t, tt, b * h);
  kernels::dropout(ctx, dprobs_, p_, key_, row_, row_stride_, dprobs_);   // through the same mask
  kernels::softmax_backward(ctx, probs_, dprobs_, dprobs_);  // dS of the scaled scores
  // dq = scale dS k; dk = scale dS^T q.
  kernels::gemm_strided_batched(ctx, false, false, t, d, t, scale, dprobs_.f32(), t, tt, k_.f32(), d, td, 0.0f,
                                dq_.f32(), d, td, b * h);
  kernels::gemm_strided_batched(ctx, true, false, t, d, t, scale, dprobs_.f32(), t, tt, q_.f32(), d, td, 0.0f,
                                dk_.f32(), d, td, b * h);
}

void CausalSelfAttention::start_cache(int64_t batch, int64_t max_len) {
  FANOUT_USER_CHECK(batch >= 1 && max_len >= 1)
      << "a key-value cache needs a positive batch and length, got " << batch << " and " << max_len;
  cache_batch_ = batch;
  cache_len_ = max_len;
  cached_ = 0;
}

void CausalSelfAttention::stop_cache() {
  k_cache_ = v_cache_ = Tensor();
  cache_batch_ = cache_len_ = cached_ = 0;
}

Tensor CausalSelfAttention::cached_forward(const Tensor& x, Context& ctx) {
  const int64_t b = x.size(0), t = x.size(1), hd = n_embd_ / n_head_;
  FANOUT_CHECK(!ctx.training) << "CausalSelfAttention: the key-value cache is for evaluation";
  FANOUT_CHECK(cache_len_ > 0) << "CausalSelfAttention: use_cache without start_cache";
  FANOUT_USER_CHECK(b == cache_batch_ && cached_ + t <= cache_len_)
      << "CausalSelfAttention: " << b << " x " << t << " tokens do not fit the key-value cache (batch "
      << cache_batch_ << ", " << cached_ << " of " << cache_len_ << " positions taken)";
  Tensor qkv = c_attn_->forward(x, ctx);  // (B, T, 3E), a low type under autocast
  const DType ht = qkv.dtype();
  // The cache outlives the call: device buffers (not a checkpointed block's shared slots).
  const Shape cs{b, n_head_, cache_len_, hd};
  const bool fits = k_cache_.defined() && k_cache_.shape() == cs && k_cache_.dtype() == ht &&
                    k_cache_.device() == ctx.device();
  if (!fits) {
    FANOUT_CHECK(cached_ == 0) << "CausalSelfAttention: the cache's type or device changed mid-sequence";
    k_cache_ = Tensor::empty(cs, ht, ctx.device());  // rows past cached_ are never read
    v_cache_ = Tensor::empty(cs, ht, ctx.device());
  }
  const Shape hs{b, n_head_, t, hd};
  ensure(q_, hs, ht, ctx);
  ensure(yh_, hs, ht, ctx);
  kernels::heads_from_rows(ctx, qkv, 0, q_);
  kernels::heads_from_rows(ctx, qkv, n_embd_, k_cache_, cached_);
  kernels::heads_from_rows(ctx, qkv, 2 * n_embd_, v_cache_, cached_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (cached_ == 0) {  // the first tokens (a prompt): causal attention among themselves, the fused kernel
    ensure(k_, hs, ht, ctx);
    ensure(v_, hs, ht, ctx);
    ensure(lse_, Shape{b, n_head_, t}, ctx);
    kernels::heads_from_rows(ctx, qkv, n_embd_, k_);
    kernels::heads_from_rows(ctx, qkv, 2 * n_embd_, v_);
    kernels::attention_forward(ctx, q_, k_, v_, scale, yh_, lse_);
  } else {
    kernels::attention_decode(ctx, q_, k_cache_, v_cache_, cached_ + t, scale, yh_);
  }
  cached_ += t;  // after the attention: a call that throws leaves the count as it was
  autocast_round(ctx, yh_);
  ensure(y_, Shape{b, t, n_embd_}, ht, ctx);
  kernels::heads_to_rows(ctx, yh_, 0, y_);
  return resid_dropout_->forward(c_proj_->forward(y_, ctx), ctx);
}

Tensor CausalSelfAttention::forward(const Tensor& x, Context& ctx) {
  FANOUT_USER_CHECK(x.dim() == 3 && x.size(2) == n_embd_)
      << "CausalSelfAttention(n_embd " << n_embd_ << ") cannot take input of shape " << x.shape().str()
      << " (expected (B, T, " << n_embd_ << "))";
  if (use_cache_) return cached_forward(x, ctx);
  x_shape_ = x.shape();
  const int64_t b = x.size(0), t = x.size(1), hd = n_embd_ / n_head_;
  Tensor qkv = c_attn_->forward(x, ctx);  // (B, T, 3E), a low type under autocast
  dropped_ = ctx.training && p_ > 0.0f;
  // The fused kernel reads the heads in the linear layer's storage; the
  // dropout path's products run on float32 heads (holding the same values).
  const DType ht = dropped_ ? DType::F32 : qkv.dtype();
  if (qkv.dtype() != ht) {
    ensure(qkv32_, qkv.shape(), ctx);
    kernels::convert(ctx, qkv, qkv32_);
    qkv = qkv32_;
  }
  const Shape hs{b, n_head_, t, hd};
  for (Tensor* h : {&q_, &k_, &v_, &yh_}) ensure(*h, hs, ht, ctx);
  ensure(lse_, Shape{b, n_head_, t}, ctx);
  kernels::heads_from_rows(ctx, qkv, 0, q_);
  kernels::heads_from_rows(ctx, qkv, n_embd_, k_);
  kernels::heads_from_rows(ctx, qkv, 2 * n_embd_, v_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (dropped_) {
    key_ = splitmix64(ctx.pass_key ^ splitmix64(salt_));
    ++ctx.random_draws;
    row_ = ctx.random_row;
    row_stride_ = ctx.random_row_stride;
    dropout_forward(ctx, scale);
  } else {
    fused_forward(ctx, scale);
  }
  autocast_round(ctx, yh_);  // a matrix product's output: the low type under autocast
  ensure(y_, Shape{b, t, n_embd_}, ht, ctx);
  kernels::heads_to_rows(ctx, yh_, 0, y_);
  Tensor out = c_proj_->forward(y_, ctx);
  return resid_dropout_->forward(out, ctx);
}

Tensor CausalSelfAttention::backward(const Tensor& dy, Context& ctx) {
  Tensor d = Module::backward_of(*resid_dropout_, "resid_dropout", dy, ctx);
  Tensor dyr = Module::backward_of(*c_proj_, "c_proj", d, ctx);  // (B, T, E)
  for (Tensor* h : {&dyh_, &dq_, &dk_, &dv_}) ensure(*h, q_.shape(), q_.dtype(), ctx);
  kernels::heads_from_rows(ctx, dyr, 0, dyh_);
  const float scale = 1.0f / std::sqrt(static_cast<float>(n_embd_ / n_head_));
  if (dropped_) dropout_backward(ctx, scale);
  else kernels::attention_backward(ctx, q_, k_, v_, scale, yh_, lse_, dyh_, dq_, dk_, dv_);
  for (Tensor* g : {&dq_, &dk_, &dv_}) autocast_round(ctx, *g);
  Shape qs = x_shape_;
  qs[-1] = 3 * n_embd_;
  ensure(dqkv_, qs, q_.dtype(), ctx);
  kernels::heads_to_rows(ctx, dq_, 0, dqkv_);
  kernels::heads_to_rows(ctx, dk_, n_embd_, dqkv_);
  kernels::heads_to_rows(ctx, dv_, 2 * n_embd_, dqkv_);
  return Module::backward_of(*c_attn_, "c_attn", dqkv_, ctx);
}

}  // namespace fanout::models
