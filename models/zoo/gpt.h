// GPT (GPT-2's architecture as nanoGPT writes it): token and learned
// position embeddings, dropout, n_layer Blocks (models/layers/transformer.h),
// a final LayerNorm and the lm_head, whose weight is the token embedding's
// (weight tying: one parameter, whose gradient sums both uses). Input (B, T)
// int32 token ids, T <= block_size; output (B, T, vocab_size) logits.
// Parameter names and shapes are nanoGPT's state_dict keys
// (transformer.wte.weight, transformer.h.0.attn.c_attn.weight (3E, E), ...,
// transformer.ln_f.weight); lm_head.weight is accepted as the tied weight's
// second name when loading. Initialization as nanoGPT's: weights N(0, 0.02),
// residual projections (c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0,
// LayerNorm weights 1.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/layers/embedding.h"
#include "models/layers/layernorm.h"
#include "models/layers/transformer.h"
#include "runtime/nn/module.h"

namespace fanout::models {

// nanoGPT's GPTConfig, by its field names; the defaults are the gpt2 preset.
struct GPTConfig {
  int64_t block_size = 1024, vocab_size = 50304;
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  float dropout = 0.0f;
  bool bias = true;
  bool operator==(const GPTConfig&) const = default;
};

// "gpt2" (12 layers, 12 heads, 768, block 1024, vocab 50304, bias: exactly
// 124,475,904 parameters) and "gpt-char" (nanoGPT's shakespeare_char: 6, 6,
// 384, block 256, dropout 0.2, no bias; vocab_size from the data).
// Parses "KEY=VALUE,..." over a preset (preset=NAME, or gpt2): keys are the
// GPTConfig fields; vocab_size defaults to `data_vocab` when that is > 0 and
// the preset does not fix it (*vocab_from_data, when given, says whether it
// did). One-line errors for unknown keys and bad values.
GPTConfig parse_gpt_config(const std::string& spec, int64_t data_vocab = 0, bool* vocab_from_data = nullptr);
// The configuration part of a model name "gpt:..." ("" for "gpt").
std::string gpt_spec(const std::string& model);
std::string to_string(const GPTConfig& c);  // "n_layer=12,n_head=12,..."

class GPT : public Module {
 public:
  // checkpoint: each Block is Checkpointed (models/layers/checkpointed.h).
  explicit GPT(const GPTConfig& config, bool checkpoint = false);
  Tensor forward(const Tensor& ids, Context& ctx) override;
  Tensor backward(const Tensor& dlogits, Context& ctx) override;
  std::unique_ptr<Module> make_like() const override { return std::make_unique<GPT>(config_, checkpoint_); }
  std::string type_name() const override { return "GPT"; }
  void finish_init(std::mt19937_64& rng) override;
  std::vector<std::pair<std::string, std::string>> tied_names() const override {
    return {{"lm_head.weight", "transformer.wte.weight"}};
  }
  // Hugging Face's GPT-2 safetensors, as nanoGPT's from_pretrained reads
  // them: GPT2Model's names (the hub's gpt2 files) or GPT2LMHeadModel's
  // ("transformer."-prefixed, as save_pretrained writes them), Conv1D's
  // (in, out) weights of c_attn, c_proj and c_fc transposed, the attention
  // mask buffers older files keep (attn.bias, attn.masked_bias) dropped, the
  // tied lm_head.weight taken once. Recognized by c_attn's weight being
  // (n_embd, 3 n_embd).
  void adapt_state_dict(std::vector<std::pair<std::string, Tensor>>& tensors) const override;
  // The inverse, for Hugging Face's GPT2LMHeadModel: this model's weights
  // under the names its save_pretrained writes ("transformer."-prefixed),
  // c_attn, c_proj and c_fc as Conv1D's (in, out) matrices, zero biases where
  // bias=false (GPT-2's layers always have them), the tied head left to
  // tie_word_embeddings. Host float32 tensors, the model's own order.
  std::vector<std::pair<std::string, Tensor>> hf_state_dict();
  const GPTConfig& config() const { return config_; }
  // Parameters without the position embedding (nanoGPT's get_num_params()).
  int64_t num_non_embedding_parameters();

  // Incremental evaluation for generation, with a key-value cache in every
  // attention layer (models/layers/attention.h): start_sequence(B) empties
  // the caches (block_size positions each); decode(ids) runs (B, T) token ids
  // that follow those decoded since (positions [decoded(), decoded() + T),
  // at most block_size in all) and returns each row's logits at its last
  // position, (B, vocab_size), as forward's last position (float32, or the
  // autocast type). Evaluation only; forward() neither reads nor changes the
  // caches. end_sequence() frees them. A decode refused at its checks or
  // its token embedding leaves the sequence as it was; one that fails inside
  // the blocks ends it (some layers may have cached its tokens): start
  // another.
  void start_sequence(int64_t batch);
  Tensor decode(const Tensor& ids, Context& ctx);
  void end_sequence();
  int64_t decoded() const { return decoded_; }

 private:
  Tensor lm_head(const Tensor& x, Tensor& logits, Context& ctx);

  GPTConfig config_;
  bool checkpoint_;
  Embedding* wte_;
  Embedding* wpe_;
  Module* drop_;
  Module* h_;
  LayerNorm* ln_f_;
  Tensor pos_, pos_host_, emb_, x_, head_x_, logits_, dx_;
  AutocastWeights head_;
  std::vector<CausalSelfAttention*> attns_;  // decode's layers (found by the first start_sequence)
  int64_t seq_batch_ = 0, decoded_ = 0;
  Tensor dec_pos_, dec_pos_host_, dec_emb_, dec_last_, dec_logits_;
};

// A materialized GPT initialized from seed.
std::unique_ptr<GPT> gpt(const GPTConfig& config, uint64_t seed, bool checkpoint = false);

// nanoGPT's sample.py: each new token from the logits of the last position
// of the context (its last block_size tokens), divided by temperature, cut
// to the top_k largest (0: all), softmax (in double), and drawn with the
// seeded generator: the same seed gives the same tokens. With kv_cache
// (the default) each new token runs alone against the cached keys and
// values of the tokens before it (GPT::decode) while the context fits
// block_size; past it the context window slides and its positions change,
// so it runs whole each time (the last position's logits alone). Without
// kv_cache every token runs forward() on the whole context, nanoGPT's way.
struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 200;
  uint64_t seed = 1337;
  bool kv_cache = true;
  int64_t vocab_limit = 0;  // draw among the first N tokens only (a padded vocabulary's text); 0: all
};
// One-line errors for options generate() cannot take.
void check_sample_options(const SampleOptions& o);
// `ids`: the prompt (at least one token); returns the new tokens, each also
// passed to `on_token` as it is drawn. The model is put in evaluation mode.
// One-line errors for bad options.
std::vector<int32_t> generate(GPT& model, Context& ctx, const std::vector<int32_t>& ids, const SampleOptions& o,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace fanout::models
