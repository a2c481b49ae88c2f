// GPT model and its configuration.
#include "models/zoo/gpt.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <limits>
#include <random>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "kernels/convert.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "models/layers/checkpointed.h"
#include "models/layers/dropout.h"
#include "models/layers/init.h"
#include "models/layers/sequential.h"
#include "runtime/core/error.h"
#include "runtime/core/memory.h"

namespace fanout::models {

namespace {

GPTConfig preset(const std::string& name) {
  if (name == "gpt2") return GPTConfig{};
  if (name == "gpt-char") return GPTConfig{256, 0, 6, 6, 384, 0.2f, false};  // vocab: the data's
  FANOUT_FAIL() << "unknown GPT preset '" << name << "' (known: gpt2, gpt-char)";
}

constexpr int64_t kMaxSize = int64_t{1} << 24;  // each size; products of them stay far inside int64

int64_t parse_int(const std::string& key, const std::string& v) {
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  FANOUT_USER_CHECK(ec == std::errc() && end == v.data() + v.size() && out >= 1)
      << "gpt: " << key << "=" << v << " is not a positive integer";
  FANOUT_USER_CHECK(out <= kMaxSize) << "gpt: " << key << "=" << v << " is larger than " << kMaxSize;
  return out;
}

}  // namespace

std::string gpt_spec(const std::string& model) { return model.size() > 4 ? model.substr(4) : ""; }

GPTConfig parse_gpt_config(const std::string& spec, int64_t data_vocab, bool* vocab_from_data) {
  std::vector<std::pair<std::string, std::string>> kv;
  std::string preset_name = "gpt2";
  std::stringstream ss(spec);
  bool first = true;
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;  // "a,,b" and a trailing comma: checkpoints keep the string as it was given
    const size_t eq = item.find('=');
    const bool bare = std::exchange(first, false) && eq == std::string::npos;
    if (bare) {
      preset_name = item;  // a bare first item names the preset: "gpt-char,n_layer=4"
      kv.emplace_back("preset", item);
      continue;
    }
    FANOUT_USER_CHECK(eq != std::string::npos && eq > 0)
        << "gpt: '" << item << "' is not KEY=VALUE (keys: preset, n_layer, n_head, n_embd, block_size, vocab_size, "
        << "dropout, bias)";
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    for (const auto& [k, v] : kv)
      FANOUT_USER_CHECK(k != key) << "gpt: " << key << " is given twice (" << k << "=" << v << ", " << item << ")";
    if (key == "preset") preset_name = value;
    kv.emplace_back(key, value);
  }
  GPTConfig c = preset(preset_name);
  bool vocab_given = false;
  for (const auto& [key, v] : kv) {
    if (key == "preset") continue;
    if (key == "n_layer") c.n_layer = parse_int(key, v);
    else if (key == "n_head") c.n_head = parse_int(key, v);
    else if (key == "n_embd") c.n_embd = parse_int(key, v);
    else if (key == "block_size") c.block_size = parse_int(key, v);
    else if (key == "vocab_size") c.vocab_size = parse_int(key, v), vocab_given = true;
    else if (key == "dropout") {
      char* end = nullptr;
      const float p = std::strtof(v.c_str(), &end);
      FANOUT_USER_CHECK(!v.empty() && end == v.c_str() + v.size() && std::isfinite(p) && p >= 0 && p < 1)
          << "gpt: dropout=" << v << " is not a probability in [0, 1)";
      c.dropout = p;
    } else if (key == "bias") {
      // nanoGPT's configurator spells Python's True and False.
      const bool on = v == "true" || v == "True" || v == "1", off = v == "false" || v == "False" || v == "0";
      FANOUT_USER_CHECK(on || off) << "gpt: bias=" << v << " is not true or false (true, True, 1, false, False, 0)";
      c.bias = on;
    } else {
      FANOUT_FAIL() << "gpt: unknown config key '" << key
                    << "' (keys: preset, n_layer, n_head, n_embd, block_size, vocab_size, dropout, bias)";
    }
  }
  if (vocab_from_data) *vocab_from_data = !vocab_given && c.vocab_size == 0;
  if (!vocab_given && c.vocab_size == 0) c.vocab_size = data_vocab;
  if (!vocab_given && preset_name == "gpt2" && data_vocab > c.vocab_size) c.vocab_size = data_vocab;
  FANOUT_USER_CHECK(c.vocab_size >= 1)
      << "gpt: vocab_size is not known (preset " << preset_name << " takes it from the data; give vocab_size=N)";
  FANOUT_USER_CHECK(c.n_embd % c.n_head == 0)
      << "gpt: n_embd " << c.n_embd << " is not divisible by n_head " << c.n_head;
  return c;
}

std::string to_string(const GPTConfig& c) {
  std::ostringstream os;
  os << "n_layer=" << c.n_layer << ",n_head=" << c.n_head << ",n_embd=" << c.n_embd << ",block_size="
     << c.block_size << ",vocab_size=" << c.vocab_size << ",dropout=" << c.dropout
     << ",bias=" << (c.bias ? "true" : "false");
  return os.str();
}

GPT::GPT(const GPTConfig& c, bool checkpoint) : config_(c), checkpoint_(checkpoint) {
  FANOUT_USER_CHECK(c.n_layer >= 1 && c.n_head >= 1 && c.n_embd >= 1 && c.block_size >= 1 && c.vocab_size >= 1)
      << "gpt: every size must be positive (" << to_string(c) << ")";
  for (const int64_t size : {c.n_layer, c.n_head, c.n_embd, c.block_size, c.vocab_size})
    FANOUT_USER_CHECK(size <= kMaxSize) << "gpt: every size must be at most " << kMaxSize << " (" << to_string(c) << ")";
  const double e = static_cast<double>(c.n_embd);
  const double params = 12.0 * static_cast<double>(c.n_layer) * e * e + static_cast<double>(c.vocab_size + c.block_size) * e;
  FANOUT_USER_CHECK(params < 1e15) << "gpt: " << to_string(c) << " would have about " << params
                                   << " parameters, more than any machine holds";
  FANOUT_USER_CHECK(c.n_embd % c.n_head == 0)
      << "gpt: n_embd " << c.n_embd << " is not divisible by n_head " << c.n_head;
  auto& t = register_module("transformer", std::make_unique<ModuleDict>());
  wte_ = &t.add("wte", std::make_unique<Embedding>(c.vocab_size, c.n_embd));
  wpe_ = &t.add("wpe", std::make_unique<Embedding>(c.block_size, c.n_embd));
  auto& drop = t.add("drop", std::make_unique<Dropout>(c.dropout));
  drop.set_salt(1);
  drop_ = &drop;
  auto& h = t.add("h", std::make_unique<Sequential>());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    auto b = std::make_unique<Block>(c.n_embd, c.n_head, c.dropout, c.bias);
    b->set_dropout_salt(static_cast<uint64_t>(2 + 3 * i));  // three masks a block
    h.add(checkpointed_if(checkpoint, std::move(b)));
  }
  h_ = &h;
  ln_f_ = &t.add("ln_f", std::make_unique<LayerNorm>(Shape{c.n_embd}, 1e-5f, true, c.bias));
}

namespace {

// dst (cols, rows) = src (rows, cols)^T, in 64 x 64 tiles.
template <class T>
void transpose_2d(const T* src, T* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) dst[c * rows + r] = src[r * cols + c];
}

// Conv1D's (in, out) weights in Hugging Face's GPT-2 (own name, "transformer."-prefixed).
bool conv1d_weight(const std::string& name) {
  return name.starts_with("transformer.h.") &&
         (name.ends_with(".attn.c_attn.weight") || name.ends_with(".attn.c_proj.weight") ||
          name.ends_with(".mlp.c_fc.weight") || name.ends_with(".mlp.c_proj.weight"));
}

}  // namespace

namespace {
// Every value +0 or -0 (a float tensor on the host).
bool all_zero(const Tensor& t) {
  FANOUT_USER_CHECK(t.device().is_cpu()) << "Hugging Face weights are read on the host";
  const auto zero = [&](auto mask, const auto* p) {
    return std::all_of(p, p + t.numel(), [&](auto v) { return (v & mask) == 0; });
  };
  switch (dtype_size(t.dtype())) {
    case 2: return zero(uint16_t{0x7fff}, t.data<uint16_t>());
    case 4: return zero(uint32_t{0x7fffffff}, t.data<uint32_t>());
    case 8: return zero(uint64_t{0x7fffffffffffffff}, t.data<uint64_t>());
    default: return false;
  }
}
}  // namespace

void GPT::adapt_state_dict(std::vector<std::pair<std::string, Tensor>>& tensors) const {
  const int64_t e = config_.n_embd;
  const bool conv1d = std::any_of(tensors.begin(), tensors.end(), [&](const auto& nt) {
    const std::string& n = nt.first;
    const bool c_attn = n == "h.0.attn.c_attn.weight" || n == "transformer.h.0.attn.c_attn.weight";
    return c_attn && nt.second.dim() == 2 && nt.second.size(0) == e && nt.second.size(1) == 3 * e && e > 0;
  });
  if (!conv1d) return;  // this model's own layout (or one load_state_dict will refuse)
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : tensors) {
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;  // the causal mask
    std::string own = name;
    for (const char* root : {"h.", "wte.", "wpe.", "ln_f."})
      if (own.starts_with(root)) own = "transformer." + own;
    if (!config_.bias && own.ends_with(".bias")) {  // GPT-2's layout always has them (--export-hf writes zeros)
      FANOUT_USER_CHECK(all_zero(t)) << name << " is not zero: a model with bias=false has no biases to take it "
                                                "(give bias=true)";
      continue;
    }
    if (!conv1d_weight(own) || t.dim() != 2) {
      out.emplace_back(own, t);
      continue;
    }
    FANOUT_USER_CHECK(t.device().is_cpu()) << name << ": Hugging Face weights are read on the host";
    Tensor w = Tensor::empty(Shape{t.size(1), t.size(0)}, t.dtype());
    switch (dtype_size(t.dtype())) {
      case 2: transpose_2d(t.data<uint16_t>(), w.data<uint16_t>(), t.size(0), t.size(1)); break;
      case 4: transpose_2d(t.data<uint32_t>(), w.data<uint32_t>(), t.size(0), t.size(1)); break;
      case 8: transpose_2d(t.data<uint64_t>(), w.data<uint64_t>(), t.size(0), t.size(1)); break;
      default: FANOUT_FAIL() << name << ": a " << dtype_size(t.dtype()) << "-byte type is no weight type";
    }
    out.emplace_back(own, w);
  }
  // GPT2LMHeadModel's state dict names the tied head twice; the file may keep both.
  const auto named = [&](const char* n) {
    return std::find_if(out.begin(), out.end(), [&](const auto& nt) { return nt.first == n; });
  };
  const auto head = named("lm_head.weight"), wte = named("transformer.wte.weight");
  if (head != out.end() && wte != out.end()) {
    const Tensor& a = head->second;
    const Tensor& b = wte->second;
    FANOUT_USER_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype() && a.device().is_cpu() &&
                      b.device().is_cpu() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0)
        << "lm_head.weight differs from wte.weight: an untied head, which a GPT (tied, as GPT-2's) cannot take";
    out.erase(head);
  }
  tensors = std::move(out);
}

std::vector<std::pair<std::string, Tensor>> GPT::hf_state_dict() {
  std::vector<std::pair<std::string, Tensor>> out;
  const auto own = state_dict();
  for (size_t i = 0; i < own.size(); ++i) {
    const auto& [name, value] = own[i];
    const Tensor t = value.to(Device::cpu());
    FANOUT_CHECK(t.dtype() == DType::F32) << name << " is " << dtype_name(t.dtype()) << ", not float32";
    if (conv1d_weight(name)) {
      Tensor w = Tensor::empty(Shape{t.size(1), t.size(0)}, DType::F32);
      transpose_2d(t.f32(), w.f32(), t.size(0), t.size(1));
      out.emplace_back(name, w);
    } else {
      out.emplace_back(name, t);
    }
    // Without bias=true a layer's weight is followed by the next layer's: GPT-2's zero bias goes between.
    const bool layer = name.ends_with(".weight") && !name.ends_with(".wte.weight") && !name.ends_with(".wpe.weight");
    const std::string bias = name.substr(0, name.size() - std::string("weight").size()) + "bias";
    if (layer && (i + 1 == own.size() || own[i + 1].first != bias)) {
      Tensor zero = Tensor::empty(Shape{t.size(0)}, DType::F32);
      zero.fill(0.0f);
      out.emplace_back(bias, zero);
    }
  }
  return out;
}

void GPT::finish_init(std::mt19937_64& rng) {
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (auto& [name, p] : named_parameters()) {
    const bool ln = name.find(".ln_") != std::string::npos;
    const auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends(".bias")) p->value.fill(0.0f);
    else if (ln) p->value.fill(1.0f);
    else normal_fill(p->value, ends("c_proj.weight") ? residual : 0.02f, rng);
  }
}

int64_t GPT::num_non_embedding_parameters() { return num_parameters() - wpe_->weight().value.numel(); }

Tensor GPT::forward(const Tensor& ids, Context& ctx) {
  FANOUT_USER_CHECK(ids.dtype() == DType::I32 && ids.dim() == 2)
      << "gpt takes (B, T) int32 token ids, got " << dtype_name(ids.dtype()) << " " << ids.shape().str();
  const int64_t b = ids.size(0), t = ids.size(1), e = config_.n_embd, v = config_.vocab_size;
  FANOUT_USER_CHECK(t <= config_.block_size)
      << "gpt: a sequence of " << t << " tokens is longer than block_size " << config_.block_size;
  const Device d = ctx.device();
  // Positions 0..T-1 for every row: written when the shape changes (into
  // buffers kept at their largest, so alternating batch sizes allocate nothing).
  if (!pos_.defined() || pos_.shape() != ids.shape() || !(pos_.device() == d)) {
    ensure(pos_host_, ids.shape(), DType::I32, Device::cpu());
    for (int64_t i = 0; i < b * t; ++i) pos_host_.data<int32_t>()[i] = static_cast<int32_t>(i % t);
    ensure(pos_, ids.shape(), DType::I32, d);
    pos_.copy_from(pos_host_, &ctx.compute());
    if (!d.is_cpu()) ctx.compute().synchronize();  // the host buffer is rewritten on the next change
    note_device_state_rewrite();
  }
  Tensor tok = wte_->forward(ids, ctx);
  Tensor pos = wpe_->forward(pos_, ctx);
  ensure(emb_, Shape{b, t, e}, d);
  kernels::add(ctx, tok, pos, emb_);
  Tensor x = drop_->forward(emb_, ctx);
  x = h_->forward(x, ctx);
  x_ = ln_f_->forward(x, ctx);
  head_x_ = lm_head(x_.view(Shape{b * t, e}), logits_, ctx);
  return logits_.view(Shape{b, t, v});
}

// lm_head: logits (rows, vocab) = x wte^T, a matrix product (the low type under autocast); returns the
// input as the product read it, for backward.
Tensor GPT::lm_head(const Tensor& x, Tensor& logits, Context& ctx) {
  const AutocastWeights::Cast in = head_.forward(ctx, x, wte_->weight().value, nullptr,
                                                 kernels::linear_rounds_in_low_type(ctx), true);
  ensure_autocast_output(logits, Shape{x.size(0), config_.vocab_size}, ctx);
  kernels::linear_forward(ctx, in.x, in.w, nullptr, logits);
  head_.round_output(ctx, logits);
  return in.x;
}

Tensor GPT::backward(const Tensor& dlogits, Context& ctx) {
  const int64_t bt = x_.numel() / config_.n_embd, e = config_.n_embd;
  Parameter& w = wte_->weight();
  ensure(dx_, Shape{bt, e}, ctx.device());
  // The head's share of wte's gradient (+=); the embedding adds its own and reports the sum ready.
  ctx.grad_write(static_cast<size_t>(w.offset), static_cast<size_t>(w.shape.numel()));
  const Tensor dy = dlogits.view(Shape{bt, config_.vocab_size});
  const AutocastWeights::Sinks low = head_.backward_begin(ctx, dy, w.value, w.grad, nullptr);
  Tensor* dx = &dx_;
  kernels::linear_backward(ctx, head_x_, *low.w, low.dy, dx, *low.gw, nullptr);
  head_.backward_end(ctx, w.grad, nullptr, dx);
  Tensor g = Module::backward_of(*ln_f_, "transformer.ln_f", dx_.view(x_.shape()), ctx);
  g = Module::backward_of(*h_, "transformer.h", g, ctx);
  g = Module::backward_of(*drop_, "transformer.drop", g, ctx);
  Module::backward_of(*wpe_, "transformer.wpe", g, ctx);
  Module::backward_of(*wte_, "transformer.wte", g, ctx);
  return Tensor();  // token ids take no gradient
}

void GPT::start_sequence(int64_t batch) {
  FANOUT_USER_CHECK(batch >= 1) << "gpt: a sequence batch must be positive, got " << batch;
  if (attns_.empty())
    for (auto& [name, m] : named_modules())
      if (auto* a = dynamic_cast<CausalSelfAttention*>(m)) attns_.push_back(a);
  for (CausalSelfAttention* a : attns_) a->start_cache(batch, config_.block_size);
  seq_batch_ = batch;
  decoded_ = 0;
}

void GPT::end_sequence() {
  for (CausalSelfAttention* a : attns_) a->stop_cache();
  seq_batch_ = decoded_ = 0;
}

Tensor GPT::decode(const Tensor& ids, Context& ctx) {
  FANOUT_USER_CHECK(ids.dtype() == DType::I32 && ids.dim() == 2 && ids.size(1) >= 1)
      << "gpt: decode takes (B, T) int32 token ids, got " << dtype_name(ids.dtype()) << " " << ids.shape().str();
  FANOUT_USER_CHECK(seq_batch_ > 0) << "gpt: decode needs start_sequence first (again after a decode that failed)";
  FANOUT_CHECK(!ctx.training) << "gpt: decode is for evaluation";
  const int64_t b = ids.size(0), t = ids.size(1), e = config_.n_embd;
  FANOUT_USER_CHECK(b == seq_batch_) << "gpt: decode of a batch of " << b << " in a sequence of " << seq_batch_;
  FANOUT_USER_CHECK(decoded_ + t <= config_.block_size)
      << "gpt: " << decoded_ << " decoded tokens and " << t << " more are longer than block_size "
      << config_.block_size;
  const Device d = ctx.device();
  ensure(dec_pos_host_, ids.shape(), DType::I32, Device::cpu());
  for (int64_t i = 0; i < b * t; ++i) dec_pos_host_.data<int32_t>()[i] = static_cast<int32_t>(decoded_ + i % t);
  ensure(dec_pos_, ids.shape(), DType::I32, d);
  dec_pos_.copy_from(dec_pos_host_, &ctx.compute());
  if (!d.is_cpu()) ctx.compute().synchronize();  // the host buffer is rewritten by the next call
  Tensor tok = wte_->forward(ids, ctx);
  Tensor pos = wpe_->forward(dec_pos_, ctx);
  ensure(dec_emb_, Shape{b, t, e}, d);
  kernels::add(ctx, tok, pos, dec_emb_);
  Tensor x = drop_->forward(dec_emb_, ctx);
  for (CausalSelfAttention* a : attns_) a->use_cache(true);
  try {
    x = h_->forward(x, ctx);
  } catch (...) {  // some layers may have cached the tokens: the sequence is over
    for (CausalSelfAttention* a : attns_) a->use_cache(false);
    seq_batch_ = 0;
    throw;
  }
  for (CausalSelfAttention* a : attns_) a->use_cache(false);
  decoded_ += t;
  // Each row's last position, then ln_f and the head on those rows alone.
  Tensor last_rows = x;
  if (t > 1) {
    ensure(dec_last_, Shape{b, 1, e}, x.dtype(), d);
    const Tensor rows = x.view(Shape{b * t, e});
    for (int64_t i = 0; i < b; ++i)
      dec_last_.view(Shape{b, e}).slice(i, i + 1).copy_from(rows.slice(i * t + t - 1, i * t + t), &ctx.compute());
    last_rows = dec_last_;
  }
  lm_head(ln_f_->forward(last_rows, ctx).view(Shape{b, e}), dec_logits_, ctx);
  return dec_logits_;
}

void check_sample_options(const SampleOptions& o) {
  FANOUT_USER_CHECK(std::isfinite(o.temperature) && o.temperature > 0)
      << "temperature must be positive and finite, got " << o.temperature;
  FANOUT_USER_CHECK(o.top_k >= 0) << "top-k must be non-negative (0: every token), got " << o.top_k;
  FANOUT_USER_CHECK(o.max_new_tokens >= 0) << "max new tokens must be non-negative, got " << o.max_new_tokens;
  FANOUT_USER_CHECK(o.vocab_limit >= 0) << "the vocabulary limit must be non-negative (0: none), got " << o.vocab_limit;
}

std::vector<int32_t> generate(GPT& model, Context& ctx, const std::vector<int32_t>& ids, const SampleOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  FANOUT_USER_CHECK(!ids.empty()) << "generation needs a prompt of at least one token";
  check_sample_options(o);
  const GPTConfig& c = model.config();
  FANOUT_USER_CHECK(o.vocab_limit <= c.vocab_size)
      << "the vocabulary limit " << o.vocab_limit << " exceeds the model's vocab_size " << c.vocab_size;
  for (int32_t id : ids)
    FANOUT_USER_CHECK(id >= 0 && id < c.vocab_size) << "prompt token " << id << " is outside [0, " << c.vocab_size << ")";
  model.eval();
  ctx.training = false;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int32_t> all = ids, out;
  std::vector<double> p(static_cast<size_t>(c.vocab_size));
  if (o.kv_cache) model.start_sequence(1);
  struct EndSequence {
    GPT& m;
    ~EndSequence() { m.end_sequence(); }
  } end_sequence{model};
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    // The tokens the cache lacks, or (past block_size) the last block_size anew; without the cache, the
    // plain forward of the last block_size tokens and its last position.
    const int64_t size = static_cast<int64_t>(all.size());
    int64_t from = model.decoded();
    if (!o.kv_cache || size > c.block_size) {
      if (o.kv_cache) model.start_sequence(1);
      from = size - std::min(size, c.block_size);
    }
    Tensor x = Tensor::empty(Shape{1, size - from}, DType::I32);
    std::copy(all.begin() + from, all.end(), x.data<int32_t>());
    if (!ctx.device().is_cpu()) x = x.to(ctx.device());
    Tensor last;
    if (o.kv_cache) {
      last = model.decode(x, ctx);
    } else {
      const int64_t t = size - from;
      last = model.forward(x, ctx).view(Shape{t, c.vocab_size}).slice(t - 1, t);
    }
    if (last.dtype() != DType::F32) {  // low-type logits under autocast: widened (exact)
      Tensor wide = Tensor::empty(last.shape(), DType::F32, last.device());
      kernels::convert(ctx, last, wide);
      last = wide;
    }
    ctx.compute().synchronize();
    const Tensor logits = last.to(Device::cpu());
    const float* z = logits.f32();
    // top-k: keep the logits at least as large as the k-th largest (ties kept, as torch.topk's threshold).
    double cut = -std::numeric_limits<double>::infinity();
    const int64_t drawable = o.vocab_limit > 0 ? o.vocab_limit : c.vocab_size;  // tokens past it are never drawn
    if (o.top_k > 0 && o.top_k < drawable) {
      std::vector<float> sorted(z, z + drawable);
      std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
      cut = sorted[static_cast<size_t>(o.top_k - 1)];
    }
    // Shifted by the largest logit before dividing: (z - peak) / T <= 0 for
    // any T > 0, so a tiny temperature draws the likeliest token instead of
    // inf - inf.
    double peak = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t k = 0; k < drawable; ++k) {
      FANOUT_USER_CHECK(std::isfinite(z[k]))
          << "the model's logits are not finite (" << z[k] << " for token " << k << "): are its weights?";
      if (z[k] >= cut) peak = std::max(peak, static_cast<double>(z[k]));
    }
    for (int64_t k = 0; k < drawable; ++k) {
      p[static_cast<size_t>(k)] = z[k] >= cut ? std::exp((z[k] - peak) / o.temperature) : 0.0;
      sum += p[static_cast<size_t>(k)];
    }
    double u = uniform(rng) * sum;
    int32_t next = 0;
    for (int64_t k = 0; k < drawable; ++k) {
      if (p[static_cast<size_t>(k)] == 0) continue;
      next = static_cast<int32_t>(k);
      if ((u -= p[static_cast<size_t>(k)]) < 0) break;
    }
    all.push_back(next);
    out.push_back(next);
    if (on_token) on_token(next);
  }
  return out;
}

std::unique_ptr<GPT> gpt(const GPTConfig& config, uint64_t seed, bool checkpoint) {
  auto m = std::make_unique<GPT>(config, checkpoint);
  m->init(seed);
  return m;
}

}  // namespace fanout::models
