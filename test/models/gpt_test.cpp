// GPT (models/zoo/gpt.h): nanoGPT's configuration, parameter names and
// count; logits and every parameter's gradient against a float64 GPT written
// here from the published formulas (gradients by central differences of its
// loss, so the tied weight's two uses are summed by the reference, not by
// us); the tied weight as one parameter under two names; dropout masks that
// differ per layer; DataParallel cpu:2 and cpu:3 bit for bit with one device
// (split-invariant math, AdamW and dropout); a warm step that allocates
// nothing; one-line errors for bad ids, long sequences and bad configs; and
// generation: decoding with the key-value cache against the full forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/plan_count.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/error.h"
#include "runtime/core/half.h"
#include "runtime/io/safetensors.h"
#include "runtime/io/state_dict.h"
#include "runtime/optim/clip.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel.h"
#include "runtime/parallel/single_device.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/sharded_optimizer.h"
#include "support/dist_util.h"
#include "support/test_util.h"
#include "support/trained.h"

namespace fanout {
namespace {

using models::GPT;
using models::GPTConfig;

using testing::error_of;

GPTConfig small(bool bias = true, float dropout = 0.0f) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 8;
  c.vocab_size = 11;
  c.bias = bias;
  c.dropout = dropout;
  return c;
}

Tensor ft_clone(const Tensor& t) { return testing::clone(t); }

using testing::random_ids;

// ---- a float64 GPT from the formulas (nanoGPT's model.py) ----
using P = std::map<std::string, std::vector<double>>;

P params_of(Module& m) {
  P p;
  for (auto& [name, prm] : m.named_parameters()) {
    const Tensor v = prm->value.to(Device::cpu());
    p[name].assign(v.f32(), v.f32() + v.numel());
  }
  return p;
}

// y (rows, out) = x (rows, in) W^T + b.
std::vector<double> linear(const std::vector<double>& x, int64_t in, const std::vector<double>& w,
                           const std::vector<double>* b, int64_t out) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in;
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? (*b)[static_cast<size_t>(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[static_cast<size_t>(r * in + i)] * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(r * out + o)] = s;
    }
  return y;
}

std::vector<double> layer_norm(const std::vector<double>& x, int64_t e, const std::vector<double>& w,
                               const std::vector<double>* b) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / static_cast<size_t>(e); ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < e; ++i) mean += x[r * e + i];
    mean /= static_cast<double>(e);
    for (int64_t i = 0; i < e; ++i) var += (x[r * e + i] - mean) * (x[r * e + i] - mean);
    var /= static_cast<double>(e);
    for (int64_t i = 0; i < e; ++i)
      y[r * e + i] = (x[r * e + i] - mean) / std::sqrt(var + 1e-5) * w[i] + (b ? (*b)[i] : 0.0);
  }
  return y;
}

struct Ref {
  std::vector<double> logits;  // (B, T, V)
  double loss;                 // sum over rows of (sum of the row's token losses) / T, over B
};

Ref reference(const GPTConfig& c, P& p, const Tensor& ids, const Tensor& targets) {
  const int64_t b = ids.size(0), t = ids.size(1), e = c.n_embd, v = c.vocab_size, nh = c.n_head, hd = e / nh;
  auto opt = [&](const std::string& n) { return c.bias ? &p.at(n) : nullptr; };
  std::vector<double> x(static_cast<size_t>(b * t * e));
  for (int64_t r = 0; r < b * t; ++r)
    for (int64_t i = 0; i < e; ++i)
      x[static_cast<size_t>(r * e + i)] = p.at("transformer.wte.weight")[ids.data<int32_t>()[r] * e + i] +
                                          p.at("transformer.wpe.weight")[(r % t) * e + i];
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    auto h = layer_norm(x, e, p.at(pre + "ln_1.weight"), opt(pre + "ln_1.bias"));
    auto qkv = linear(h, e, p.at(pre + "attn.c_attn.weight"), opt(pre + "attn.c_attn.bias"), 3 * e);
    std::vector<double> y(x.size(), 0.0);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t i = 0; i < t; ++i) {
          auto at = [&](int64_t tok, int64_t part, int64_t d) {
            return qkv[static_cast<size_t>((bi * t + tok) * 3 * e + part * e + hh * hd + d)];
          };
          std::vector<double> s(static_cast<size_t>(i + 1));
          double mx = -1e300, z = 0;
          for (int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += at(i, 0, d) * at(j, 1, d);
            s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[static_cast<size_t>(j)]);
          }
          for (double& sj : s) z += (sj = std::exp(sj - mx));
          for (int64_t d = 0; d < hd; ++d) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j) acc += s[static_cast<size_t>(j)] / z * at(j, 2, d);
            y[static_cast<size_t>((bi * t + i) * e + hh * hd + d)] = acc;
          }
        }
    auto a = linear(y, e, p.at(pre + "attn.c_proj.weight"), opt(pre + "attn.c_proj.bias"), e);
    for (size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    auto h2 = layer_norm(x, e, p.at(pre + "ln_2.weight"), opt(pre + "ln_2.bias"));
    auto f = linear(h2, e, p.at(pre + "mlp.c_fc.weight"), opt(pre + "mlp.c_fc.bias"), 4 * e);
    for (double& u : f) u = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));  // exact GELU
    auto m = linear(f, 4 * e, p.at(pre + "mlp.c_proj.weight"), opt(pre + "mlp.c_proj.bias"), e);
    for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  x = layer_norm(x, e, p.at("transformer.ln_f.weight"), opt("transformer.ln_f.bias"));
  Ref out{linear(x, e, p.at("transformer.wte.weight"), nullptr, v), 0.0};
  for (int64_t r = 0; r < b * t; ++r) {
    const int y = targets.data<int32_t>()[r];
    if (y < 0) continue;
    double mx = -1e300, z = 0;
    for (int64_t k = 0; k < v; ++k) mx = std::max(mx, out.logits[static_cast<size_t>(r * v + k)]);
    for (int64_t k = 0; k < v; ++k) z += std::exp(out.logits[static_cast<size_t>(r * v + k)] - mx);
    out.loss += (std::log(z) + mx - out.logits[static_cast<size_t>(r * v + y)]) / static_cast<double>(t * b);
  }
  return out;
}

TEST(GPTConfigTest, PresetsKeysAndErrors) {
  const GPTConfig g = models::parse_gpt_config("gpt2");
  EXPECT_EQ(g, GPTConfig{});
  EXPECT_EQ(GPT(g).num_parameters(), 124475904);  // nanoGPT's gpt2 with vocab 50304, wte counted once
  const GPTConfig ch = models::parse_gpt_config("gpt-char", 65);
  EXPECT_EQ(ch, (GPTConfig{256, 65, 6, 6, 384, 0.2f, false}));
  const GPTConfig mix = models::parse_gpt_config("preset=gpt-char,n_layer=4,n_head=4,n_embd=128,block_size=64", 65);
  EXPECT_EQ(mix, (GPTConfig{64, 65, 4, 4, 128, 0.2f, false}));
  EXPECT_EQ(models::parse_gpt_config("n_layer=1,bias=false,dropout=0.1,vocab_size=7").vocab_size, 7);
  // nanoGPT's configurator spelling (Python's True and False) too.
  EXPECT_FALSE(models::parse_gpt_config("vocab_size=7,bias=False").bias);
  EXPECT_TRUE(models::parse_gpt_config("vocab_size=7,bias=True").bias);
  EXPECT_NE(error_of([] { models::parse_gpt_config("vocab_size=7,bias=yes"); }).find("bias=yes is not true or false"),
            std::string::npos);
  EXPECT_EQ(error_of([] { models::parse_gpt_config("n_layers=3"); }),
            "gpt: unknown config key 'n_layers' (keys: preset, n_layer, n_head, n_embd, block_size, vocab_size, "
            "dropout, bias)");
  EXPECT_EQ(error_of([] { models::parse_gpt_config("n_embd=100,n_head=12"); }),
            "gpt: n_embd 100 is not divisible by n_head 12");
  EXPECT_EQ(error_of([] { models::parse_gpt_config("gpt-char"); }),
            "gpt: vocab_size is not known (preset gpt-char takes it from the data; give vocab_size=N)");
  EXPECT_NE(error_of([] { models::parse_gpt_config("n_layer=0"); }).find("not a positive integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { models::parse_gpt_config("dropout=1.5"); }).find("not a probability"), std::string::npos);
  EXPECT_EQ(error_of([] { models::parse_gpt_config("gpt-char,n_layer=2,vocab_size=65,n_layer=1"); }),
            "gpt: n_layer is given twice (n_layer=2, n_layer=1)");
  EXPECT_EQ(error_of([] { models::parse_gpt_config("gpt-char,vocab_size=65,preset=gpt2"); }),
            "gpt: preset is given twice (preset=gpt-char, preset=gpt2)");
  // Empty items are skipped (a checkpoint keeps the string as given), a bare name only first.
  EXPECT_EQ(models::parse_gpt_config(",gpt-char,,n_layer=4,n_head=4,n_embd=128,block_size=64,", 65), mix);
  EXPECT_NE(error_of([] { models::parse_gpt_config("n_layer=2,gpt-char"); }).find("'gpt-char' is not KEY=VALUE"),
            std::string::npos);
}

TEST(GPTModel, NanoGPTNamesAndShapes) {
  GPT m(models::parse_gpt_config("gpt2"));
  const auto ps = m.named_parameters();
  ASSERT_EQ(ps.size(), 148u);  // wte, wpe, 12 blocks x 12, ln_f weight and bias
  std::map<std::string, Shape> shapes;
  for (auto& [n, p] : ps) shapes[n] = p->shape;
  EXPECT_EQ(ps.front().first, "transformer.wte.weight");
  EXPECT_EQ(shapes.at("transformer.wte.weight"), (Shape{50304, 768}));
  EXPECT_EQ(shapes.at("transformer.wpe.weight"), (Shape{1024, 768}));
  EXPECT_EQ(shapes.at("transformer.h.0.ln_1.weight"), (Shape{768}));
  EXPECT_EQ(shapes.at("transformer.h.0.attn.c_attn.weight"), (Shape{2304, 768}));
  EXPECT_EQ(shapes.at("transformer.h.0.attn.c_attn.bias"), (Shape{2304}));
  EXPECT_EQ(shapes.at("transformer.h.5.attn.c_proj.weight"), (Shape{768, 768}));
  EXPECT_EQ(shapes.at("transformer.h.11.mlp.c_fc.weight"), (Shape{3072, 768}));
  EXPECT_EQ(shapes.at("transformer.h.11.mlp.c_proj.weight"), (Shape{768, 3072}));
  EXPECT_EQ(shapes.at("transformer.ln_f.bias"), (Shape{768}));
  EXPECT_EQ(shapes.count("lm_head.weight"), 0u) << "the tied weight is one parameter";
  GPT nb(models::parse_gpt_config("gpt-char", 65));
  for (auto& [n, p] : nb.named_parameters()) EXPECT_EQ(n.find("bias"), std::string::npos) << n;
}

TEST(GPTModel, InitializationIsNanoGPTs) {
  GPTConfig c = small();
  c.n_embd = 64;
  c.vocab_size = 500;
  auto m = models::gpt(c, 3);
  for (auto& [name, p] : m->named_parameters()) {
    const Tensor v = p->value;
    double sq = 0, sum = 0;
    for (int64_t i = 0; i < v.numel(); ++i) sq += double(v.f32()[i]) * v.f32()[i], sum += v.f32()[i];
    const double rms = std::sqrt(sq / static_cast<double>(v.numel()));
    SCOPED_TRACE(name);
    if (name.find(".ln_") != std::string::npos && name.find("weight") != std::string::npos) EXPECT_EQ(sum, v.numel());
    else if (name.find("bias") != std::string::npos) EXPECT_EQ(sq, 0.0);
    else if (name.find("c_proj.weight") != std::string::npos) EXPECT_NEAR(rms, 0.01, 0.0015);  // 0.02 / sqrt(4)
    else EXPECT_NEAR(rms, 0.02, 0.002);
  }
}

// Logits and every gradient element against the float64 GPT.
TEST(GPTModel, LogitsAndGradientsMatchAFloat64GPT) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    const GPTConfig c = small(bias);
    auto m = models::gpt(c, 7);
    std::mt19937_64 rng(8);
    const int64_t b = 3, t = 7;
    const Tensor ids = random_ids(b, t, 11, rng), targets = random_ids(b, t, 11, rng, /*some_ignored=*/true);
    Context ctx(Device::cpu());
    ctx.training = true;
    auto crit = make_criterion({CriterionKind::TokenCrossEntropy});
    m->zero_grad();
    const Tensor out = m->forward(ids, ctx);
    crit->forward(ctx, out, targets, true, 1.0f / static_cast<float>(b));
    Module::backward_of(*m, "model", crit->grad(), ctx);
    P p = params_of(*m);
    const Ref ref = reference(c, p, ids, targets);
    double peak = 0, worst = 0;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      peak = std::max(peak, std::abs(ref.logits[i]));
      worst = std::max(worst, std::abs(ref.logits[i] - out.f32()[i]));
    }
    EXPECT_LT(worst, 1e-5 * peak) << "logits";
    EXPECT_NEAR(crit->read(ctx).loss_sum / b, ref.loss, 1e-5 * ref.loss);
    for (auto& [name, prm] : m->named_parameters()) {
      std::vector<double>& w = p.at(name);
      std::vector<double> fd(w.size());
      double gpeak = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const double h = 1e-5, keep = w[i];
        w[i] = keep + h;
        const double up = reference(c, p, ids, targets).loss;
        w[i] = keep - h;
        const double down = reference(c, p, ids, targets).loss;
        w[i] = keep;
        fd[i] = (up - down) / (2 * h);
        gpeak = std::max(gpeak, std::abs(fd[i]));
      }
      ASSERT_GT(gpeak, 0.0) << name;
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_NEAR(prm->grad.f32()[i], fd[i], 1e-5 * gpeak + 1e-9) << name << " element " << i;
    }
  }
}

TEST(GPTModel, TiedWeightLoadsUnderEitherNameAndOnce) {
  auto m = models::gpt(small(), 1);
  const auto sd = m->state_dict();
  for (auto& [n, t] : sd) EXPECT_NE(n, "lm_head.weight");
  std::mt19937_64 rng(2);
  const Tensor wte = testing::random_tensor(Shape{11, 8}, rng);
  std::vector<std::pair<std::string, Tensor>> file;
  for (auto& [n, t] : sd) file.emplace_back(n == "transformer.wte.weight" ? "lm_head.weight" : n, t.to(Device::cpu()));
  for (auto& [n, t] : file)
    if (n == "lm_head.weight") t = wte;
  io::load_state_dict(*m, file, /*strict=*/true);  // safetensors' save_model keeps lm_head.weight
  EXPECT_TRUE(testing::same_bits(m->named_parameters().front().second->value, wte));
  file.emplace_back("transformer.wte.weight", wte);
  EXPECT_EQ(error_of([&] { io::load_state_dict(*m, file, true); }),
            "load_state_dict: the file has both lm_head.weight and transformer.wte.weight, which name the same "
            "tensor");
}

TEST(GPTModel, DropoutMasksDifferPerLayerAndEvalIsDeterministic) {
  auto m = models::gpt(small(true, 0.3f), 4);
  std::mt19937_64 rng(5);
  const Tensor ids = random_ids(2, 8, 11, rng);
  Context ctx(Device::cpu());
  m->eval();
  ctx.training = false;
  const Tensor a = m->forward(ids, ctx).to(Device::cpu());
  const Tensor b = m->forward(ids, ctx).to(Device::cpu());
  EXPECT_TRUE(testing::same_bits(a, b));
  m->train();
  ctx.training = true;
  ctx.pass_key = 42;
  const Tensor t1 = m->forward(ids, ctx).to(Device::cpu());
  EXPECT_FALSE(testing::same_bits(t1, a)) << "training drops";
  ctx.pass_key = 43;
  EXPECT_FALSE(testing::same_bits(m->forward(ids, ctx).to(Device::cpu()), t1)) << "another pass, another mask";
}

TEST(GPTModel, BadInputIsOneLine) {
  auto m = models::gpt(small(), 1);
  Context ctx(Device::cpu());
  Tensor ids = Tensor::zeros(Shape{3, 4}, DType::I32);
  ids.data<int32_t>()[9] = 11;  // row 2, position 1
  EXPECT_EQ(error_of([&] { m->forward(ids, ctx); }),
            "embedding_forward: id 11 at batch row 2, position 1 is outside the vocabulary [0, 11)");
  EXPECT_EQ(error_of([&] { m->forward(Tensor::zeros(Shape{2, 9}, DType::I32), ctx); }),
            "gpt: a sequence of 9 tokens is longer than block_size 8");
  EXPECT_NE(error_of([&] { m->forward(Tensor::zeros(Shape{2, 4}), ctx); }).find("int32 token ids"), std::string::npos);
  EXPECT_EQ(error_of([] { models::make_model("gpt:n_layer=1,n_embd=8,n_head=2,block_size=4", Shape{5}, 11, 1); }),
            "gpt: a sequence of 5 tokens is longer than block_size 4");
}

std::vector<testing::Batch> token_batches(int64_t rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<testing::Batch> out;
  for (int s = 0; s < steps; ++s) out.push_back({random_ids(rows, 8, 11, rng), random_ids(rows, 8, 11, rng, true)});
  return out;
}

Tensor trained_gpt(const std::string& devices, const std::vector<testing::Batch>& data) {
  auto m = models::gpt(small(true, 0.1f), 9);
  EngineSpec spec = testing::engine_on(devices);
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw(1e-2f));
  for (const auto& b : data) {
    e->forward_backward_batch(b.x, b.y);
    optim::clip_grad_norm(*e.opt, 1.0);
    e.opt->step();
    e.opt->zero_grad();
  }
  return m->arenas().params.to(Device::cpu());
}

TEST(GPTUnderDataParallel, SplitInvariantEqualsOneDeviceBitForBit) {
  const auto data = token_batches(6, 10, 21);
  const Tensor one = trained_gpt("cpu", data);
  for (const char* devices : {"cpu:2", "cpu:3"}) EXPECT_TRUE(testing::same_bits(trained_gpt(devices, data), one)) << devices;
  const Tensor init = models::gpt(small(true, 0.1f), 9)->arenas().params;
  EXPECT_GT(testing::max_rel_diff(one, init), 1e-3) << "training moved the parameters";
}

TEST(GPTUnderDataParallel, WarmStepAllocatesNothing) {
  // Under autocast too: the weight casts a step, the low-type activations and the staging they need.
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (const char* devices : {"cpu", "cpu:2", "cpu:2 sharded gradients"}) {
      SCOPED_TRACE(std::string(devices) + " " + dtype_name(t));
      const bool grads = std::string(devices).find("sharded") != std::string::npos;
      auto m = models::gpt(small(true, 0.1f), 2);
      EngineSpec spec = testing::engine_on(grads ? "cpu:2" : devices, /*split_invariant=*/false);
      spec.dp.math.autocast = t;
      spec.dp.shard_optimizer = spec.dp.shard_grads = grads;
      spec.loss.criterion = CriterionKind::TokenCrossEntropy;
      testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw());
      auto data = token_batches(6, 2, 3);
      data.push_back(token_batches(4, 1, 4)[0]);  // a smaller last batch
      for (auto& b : data) e.train_step(b.x, b.y, 1e-3f);
      const auto before = alloc_stats();
      const auto modules = Module::constructed();
      const uint64_t plans = kernels::cpu::onednn_plans_made();
      for (int rep = 0; rep < 2; ++rep)
        for (auto& b : data) e.train_step(b.x, b.y, 1e-3f);
      EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
      EXPECT_EQ(Module::constructed(), modules);
      EXPECT_EQ(kernels::cpu::onednn_plans_made(), plans);
    }
}

// ZeRO-1 (--shard-optimizer) and ZeRO-2 (--shard-grads) over a GPT equal
// the unsharded optimizer bit for bit: the tied weight is one range of the
// arena, stepped once; under ZeRO-2 the head's share of its gradient and
// the embedding's meet in one block (or window) before it is reduced.
TEST(GPTUnderDataParallel, ShardedOptimizerEqualsUnsharded) {
  const auto data = token_batches(6, 5, 31);
  auto run = [&](const std::string& devices, bool shard, bool grads = false) {
    auto m = models::gpt(small(true, 0.1f), 12);
    DataParallelOptions dpo;
    dpo.shard_optimizer = shard || grads;
    dpo.shard_grads = grads;
    dpo.bucket_bytes = 4096;  // several buckets, cut by the shard bounds
    DataParallelEngine e(*m, parse_devices(devices), *make_criterion({CriterionKind::TokenCrossEntropy}), dpo);
    auto opt = train::make_engine_optimizer(e, testing::test_adamw(1e-2f));
    for (const auto& b : data) train::train_step(e, *opt, b.x, b.y, 1e-2f);
    return m->arenas().params.to(Device::cpu());
  };
  for (const char* devices : {"cpu:2", "cpu:3"}) {
    const Tensor want = run(devices, false);
    EXPECT_TRUE(testing::same_bits(run(devices, true), want)) << devices;
    EXPECT_TRUE(testing::same_bits(run(devices, false, true), want)) << devices << ", sharded gradients";
  }
}

// ZeRO-2 over a GPT with dropout in split-invariant math, accumulating two
// micro-batches and clipping by norm: bit for bit ZeRO-1 (the same shards'
// squares), and bit for bit unsharded without clipping.
TEST(GPTUnderDataParallel, ShardedGradsAccumulateAndClipAsShardedOptimizer) {
  auto data = token_batches(6, 4, 32);
  data.push_back(token_batches(2, 1, 33)[0]);  // on cpu:3 the third replica sits out
  auto run = [&](bool shard, bool grads, double max_norm) {
    auto m = models::gpt(small(true, 0.1f), 12);
    DataParallelOptions dpo;
    dpo.shard_optimizer = shard || grads;
    dpo.shard_grads = grads;
    dpo.bucket_bytes = 4096;
    dpo.math.split_invariant = true;
    DataParallelEngine e(*m, parse_devices("cpu:3"), *make_criterion({CriterionKind::TokenCrossEntropy}), dpo);
    auto opt = train::make_engine_optimizer(e, testing::test_adamw(1e-2f));
    for (const auto& b : data) {
      const int64_t rows = b.x.size(0), half = rows / 2;
      e.forward_backward(b.x.slice(0, half), b.y.slice(0, half), 1.0f / rows, true);
      e.forward_backward(b.x.slice(half, rows), b.y.slice(half, rows), 1.0f / rows, true);
      if (max_norm > 0) optim::clip_grad_norm(*opt, max_norm);
      opt->step();
      opt->zero_grad();
    }
    return m->arenas().params.to(Device::cpu());
  };
  EXPECT_TRUE(testing::same_bits(run(false, true, 0.5), run(true, false, 0.5)));
  EXPECT_TRUE(testing::same_bits(run(false, true, 0), run(false, false, 0)));
}

// nanoGPT's optimizer groups: decay for parameters of two or more
// dimensions (the embeddings and linear weights), none for the rest.
TEST(GPTModel, NoDecayGroupIsTheOneDimensionalParameters) {
  auto m = models::gpt(small(), 1);
  const std::vector<std::string> nd = optim::no_decay_params(*m);
  size_t one_d = 0;
  for (auto& [n, p] : m->named_parameters()) {
    const bool listed = std::find(nd.begin(), nd.end(), n) != nd.end();
    EXPECT_EQ(listed, p->shape.ndim == 1) << n;
    one_d += p->shape.ndim == 1;
  }
  EXPECT_EQ(nd.size(), one_d);
}

// bf16-mixed (torch.autocast's lists): the matrix products' outputs (here
// the logits) are bfloat16 values, the logits stay within bfloat16's
// rounding of float32's, training lowers the loss, DataParallel cpu:2's
// gradients stay within the low type's rounding of one device's, and a warm mixed step
// allocates nothing.
TEST(GPTMixedPrecision, Bf16MixedRoundsWhereAutocastDoesAndTrains) {
  const GPTConfig c = small(true, 0.0f);
  std::mt19937_64 rng(13);
  const Tensor ids = random_ids(4, 8, 11, rng), targets = random_ids(4, 8, 11, rng);
  auto logits = [&](DType autocast) {
    auto m = models::gpt(c, 2);
    Context ctx(Device::cpu());
    ctx.math.autocast = autocast;
    return ft_clone(m->forward(ids, ctx));
  };
  const Tensor f32 = logits(DType::F32), bf16 = logits(DType::BF16);
  ASSERT_EQ(bf16.dtype(), DType::BF16) << "autocast stores the logits in bfloat16";
  double peak = 0, worst = 0;
  for (int64_t i = 0; i < f32.numel(); ++i) {
    const double low = half::float_from_bf16(bf16.data<uint16_t>()[i]);
    peak = std::max(peak, std::abs(double(f32.f32()[i])));
    worst = std::max(worst, std::abs(double(f32.f32()[i]) - low));
  }
  EXPECT_GT(worst, 0.0) << "autocast changed nothing";
  EXPECT_LT(worst, 0.03 * peak);
  auto engine = [&](Module& m, const std::string& devices) {
    EngineSpec spec = testing::engine_on(devices, false);
    spec.loss.criterion = CriterionKind::TokenCrossEntropy;
    spec.dp.math.autocast = DType::BF16;
    return testing::EngineRun(make_engine(m, std::move(spec)), testing::test_adamw(1e-2f));
  };
  {
    auto m = models::gpt(c, 2);
    auto e = engine(*m, "cpu");
    const double first = e.train_step(ids, targets, 1e-2f).loss_sum / 4;
    double last = first;
    for (int s = 0; s < 30; ++s) last = e.train_step(ids, targets, 1e-2f).loss_sum / 4;
    EXPECT_LT(last, 0.5 * first) << "bf16-mixed training lowers the loss";
  }
  // One step's gradients: the replicas' float32 sums differ from one
  // device's only in their order, far inside bfloat16's rounding.
  auto grads = [&](const std::string& devices) {
    auto m = models::gpt(c, 2);
    auto e = engine(*m, devices);
    e->forward_backward_batch(ids, targets);
    return m->arenas().grads.to(Device::cpu());
  };
  const Tensor one = grads("cpu"), two = grads("cpu:2");
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < one.numel(); ++i) {
    diff += std::pow(double(one.f32()[i]) - two.f32()[i], 2);
    norm += std::pow(double(one.f32()[i]), 2);
  }
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(std::sqrt(diff), 6 * std::ldexp(1.0, -8) * std::sqrt(norm)) << "cpu:2 against cpu";
  // Warm: nothing allocated.
  auto m = models::gpt(c, 2);
  EngineSpec spec = testing::engine_on("cpu:2", false);
  spec.loss.criterion = CriterionKind::TokenCrossEntropy;
  spec.dp.math.autocast = DType::BF16;
  testing::EngineRun e(make_engine(*m, std::move(spec)), testing::test_adamw());
  for (int s = 0; s < 2; ++s) e.train_step(ids, targets, 1e-3f);
  const auto before = alloc_stats();
  for (int s = 0; s < 3; ++s) e.train_step(ids, targets, 1e-3f);
  EXPECT_EQ(alloc_stats().host_allocs, before.host_allocs);
}

// Sampling: top_k 1 is greedy decoding (each token the argmax of the last
// position's logits, computed here from forward); a seed repeats its draws;
// every token lies in the vocabulary; bad options are one line.
// max |a - b| over max |b|; infinite where an element is not finite.
double rel_diff(const float* a, const float* b, int64_t n) {
  double d = 0, peak = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::abs(double(a[i]) - b[i]);
    d = std::isfinite(e) ? std::max(d, e) : std::numeric_limits<double>::infinity();
    peak = std::max(peak, std::abs(double(b[i])));
  }
  EXPECT_GT(peak, 0.0);
  return d / peak;
}

// GPT::decode with the key-value cache: fed in pieces, each call's logits are
// the full forward's at the piece's last position (float32 within 1e-5 of
// the largest logit; bf16-mixed within bfloat16's rounding), with and
// without checkpointed blocks; a plain forward in between neither reads nor
// disturbs the cache, nor does a refused token; past block_size, a wrong
// batch and training are refused; a decode failing inside the layers ends
// the sequence, and a new one decodes as before.
TEST(GPTDecode, CachedLogitsAreTheFullForwardsLastPositions) {
  std::mt19937_64 rng(12);
  const int64_t b = 2, t = 8, v = 11;
  const Tensor ids = random_ids(b, t, v, rng);
  for (DType autocast : {DType::F32, DType::BF16})
    for (bool checkpoint : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(autocast)) + (checkpoint ? ", checkpointed" : ""));
      auto m = models::gpt(small(), 7, checkpoint);
      Context ctx(Device::cpu());
      ctx.math.autocast = autocast;
      ctx.training = false;
      m->eval();
      const Tensor full = testing::float32_values(m->forward(ids, ctx));  // (B, T, V)
      m->start_sequence(b);
      int64_t n = 0;
      for (int64_t piece : {3, 1, 2, 1, 1}) {
        Tensor x = Tensor::empty(Shape{b, piece}, DType::I32);
        for (int64_t r = 0; r < b; ++r)
          std::copy(ids.data<int32_t>() + r * t + n, ids.data<int32_t>() + r * t + n + piece,
                    x.data<int32_t>() + r * piece);
        const Tensor got = testing::float32_values(m->decode(x, ctx));
        n += piece;
        ASSERT_EQ(got.shape(), Shape({b, v}));
        ASSERT_EQ(m->decoded(), n);
        for (int64_t r = 0; r < b; ++r)
          EXPECT_LT(rel_diff(got.f32() + r * v, full.f32() + (r * t + n - 1) * v, v),
                    autocast == DType::F32 ? 1e-5 : 0.03)
              << "row " << r << " after " << n << " tokens";
        if (n == 4) {  // a plain forward between pieces: the same logits, and the cache continues below
          EXPECT_TRUE(testing::same_bits(testing::float32_values(m->forward(ids, ctx)), full));
          // A token outside the vocabulary is refused before any layer caches it.
          Tensor bad = Tensor::zeros(Shape{b, 1}, DType::I32);
          bad.data<int32_t>()[1] = 11;
          EXPECT_NE(error_of([&] { m->decode(bad, ctx); }).find("outside the vocabulary"), std::string::npos);
          EXPECT_EQ(m->decoded(), 4);
        }
      }
      EXPECT_EQ(error_of([&] { m->decode(Tensor::zeros(Shape{b, 1}, DType::I32), ctx); }),
                "gpt: 8 decoded tokens and 1 more are longer than block_size 8");
      m->start_sequence(b);
      EXPECT_EQ(m->decoded(), 0);
      EXPECT_EQ(error_of([&] { m->decode(Tensor::zeros(Shape{1, 2}, DType::I32), ctx); }),
                "gpt: decode of a batch of 1 in a sequence of 2");
      ctx.training = true;
      EXPECT_NE(error_of([&] { m->decode(Tensor::zeros(Shape{b, 1}, DType::I32), ctx); }).find("for evaluation"),
                std::string::npos);
      ctx.training = false;
      // A decode that fails inside the layers (here: the cache's storage type changed under it, after the
      // first layer's projection) ends the sequence; a new one decodes as before.
      Tensor first = Tensor::empty(Shape{b, 3}, DType::I32);
      for (int64_t r = 0; r < b; ++r) std::copy(ids.data<int32_t>() + r * t, ids.data<int32_t>() + r * t + 3,
                                                first.data<int32_t>() + r * 3);
      m->start_sequence(b);
      m->decode(first, ctx);
      ctx.math.autocast = autocast == DType::F32 ? DType::BF16 : DType::F32;
      EXPECT_NE(error_of([&] { m->decode(Tensor::zeros(Shape{b, 1}, DType::I32), ctx); }).find("changed"),
                std::string::npos);
      ctx.math.autocast = autocast;
      EXPECT_EQ(error_of([&] { m->decode(Tensor::zeros(Shape{b, 1}, DType::I32), ctx); }),
                "gpt: decode needs start_sequence first (again after a decode that failed)");
      m->start_sequence(b);
      const Tensor again = testing::float32_values(m->decode(first, ctx));
      for (int64_t r = 0; r < b; ++r)
        EXPECT_LT(rel_diff(again.f32() + r * v, full.f32() + (r * t + 2) * v, v), autocast == DType::F32 ? 1e-5 : 0.03);
      m->end_sequence();
    }
}

// Hugging Face's GPT-2 layout, written here from its documented form
// (GPT2Model's names; Conv1D keeps (in, out) weights; each attention layer's
// causal mask saved as the buffers attn.bias and attn.masked_bias; the tied
// lm_head.weight beside), loads as nanoGPT's from_pretrained reads it: the
// same parameters bit for bit and the same logits. GPT2LMHeadModel's
// "transformer."-prefixed names load too; the raw loader refuses the layout.
TEST(GPTWeights, HuggingFaceLayoutLoadsAsFromPretrainedReadsIt) {
  const GPTConfig c = small();
  auto m = models::gpt(c, 31);
  const auto own = io::state_dict_cpu(*m);
  const auto transpose = [](const Tensor& t) {
    Tensor w = Tensor::empty(Shape{t.size(1), t.size(0)}, DType::F32);
    for (int64_t r = 0; r < t.size(0); ++r)
      for (int64_t k = 0; k < t.size(1); ++k) w.f32()[k * t.size(0) + r] = t.f32()[r * t.size(1) + k];
    return w;
  };
  testing::TempDir dir;
  Context ctx(Device::cpu());
  Tensor ids = Tensor::empty(Shape{2, 8}, DType::I32);
  for (int64_t i = 0; i < 16; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % 11);
  const Tensor want = testing::clone(m->forward(ids, ctx));
  for (const std::string prefix : {"", "transformer."}) {
    std::vector<std::pair<std::string, Tensor>> hf;
    for (const auto& [name, t] : own) {
      const std::string bare = name.substr(std::string("transformer.").size());
      const bool conv1d = bare.find("c_attn.weight") != std::string::npos || bare.find("c_fc.weight") != std::string::npos ||
                          (bare.find("c_proj.weight") != std::string::npos);
      hf.emplace_back(prefix + bare, conv1d ? transpose(t) : t);
    }
    for (int64_t layer = 0; layer < c.n_layer; ++layer) {
      Tensor mask = Tensor::empty(Shape{1, 1, 8, 8}, DType::F32);
      for (int64_t i = 0; i < 64; ++i) mask.f32()[i] = i % 8 <= i / 8 ? 1.0f : 0.0f;
      Tensor masked = Tensor::empty(Shape{}, DType::F32);
      masked.f32()[0] = -1e4f;
      hf.emplace_back(prefix + "h." + std::to_string(layer) + ".attn.bias", mask);
      hf.emplace_back(prefix + "h." + std::to_string(layer) + ".attn.masked_bias", masked);
    }
    hf.emplace_back("lm_head.weight", own[0].second);
    ASSERT_EQ(own[0].first, "transformer.wte.weight");
    const std::string path = dir.path() + "/hf" + prefix + "safetensors";
    io::save_safetensors(path, hf);
    auto loaded = models::gpt(c, 99);
    EXPECT_TRUE(train::load_weights(path, *loaded, /*strict=*/true).ok());
    const auto got = io::state_dict_cpu(*loaded);
    ASSERT_EQ(got.size(), own.size());
    for (size_t i = 0; i < own.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].second.raw(), own[i].second.raw(), own[i].second.nbytes()), 0) << own[i].first;
    EXPECT_EQ(rel_diff(loaded->forward(ids, ctx).f32(), want.f32(), want.numel()), 0.0) << "prefix '" << prefix << "'";
    hf.back().second = testing::clone(own[0].second);  // an untied head: refused by name
    hf.back().second.f32()[3] += 1.0f;
    io::save_safetensors(path, hf);
    EXPECT_EQ(error_of([&] { train::load_weights(path, *loaded, true); }),
              path + ": lm_head.weight differs from wte.weight: an untied head, which a GPT (tied, as GPT-2's) "
                     "cannot take");
    auto raw = models::gpt(c, 99);
    EXPECT_NE(error_of([&] { io::load_state_dict(*raw, hf, /*strict=*/true); }), "(no error)") << "not our layout";
  }
}

// hf_state_dict() writes GPT2LMHeadModel's state dict as save_pretrained
// does, spelled out here from its documented layout: "transformer."-prefixed
// names in module order, every Linear and LayerNorm with its bias (zeros for
// a model without them), Conv1D's (in, out) weights, no lm_head.weight (tied).
// Read back by the Hugging Face loader it gives the same logits.
TEST(GPTWeights, HuggingFaceExportIsGpt2sLayout) {
  for (const bool bias : {true, false}) {
    const GPTConfig c = small(bias);
    auto m = models::gpt(c, 33);
    const auto own = io::state_dict_cpu(*m);
    const auto value = [&](const std::string& n) -> const Tensor* {
      for (const auto& [name, t] : own)
        if (name == n) return &t;
      return nullptr;
    };
    const auto hf = m->hf_state_dict();
    std::vector<std::string> names = {"transformer.wte.weight", "transformer.wpe.weight"};
    for (int64_t l = 0; l < c.n_layer; ++l)
      for (const char* layer : {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"})
        for (const char* kind : {".weight", ".bias"})
          names.push_back("transformer.h." + std::to_string(l) + "." + layer + kind);
    names.push_back("transformer.ln_f.weight");
    names.push_back("transformer.ln_f.bias");
    ASSERT_EQ(hf.size(), names.size()) << "bias " << bias;
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& [name, t] = hf[i];
      ASSERT_EQ(name, names[i]);
      ASSERT_TRUE(t.device().is_cpu() && t.dtype() == DType::F32) << name;
      const Tensor* mine = value(name);
      const bool conv1d = name.find("c_attn.weight") != std::string::npos || name.find("c_fc.weight") != std::string::npos ||
                          name.find("c_proj.weight") != std::string::npos;
      if (!mine) {  // a bias the model does not have
        ASSERT_FALSE(bias) << name;
        ASSERT_EQ(t.dim(), 1) << name;
        const Tensor* w = value(name.substr(0, name.size() - 4) + "weight");
        ASSERT_NE(w, nullptr) << name;
        EXPECT_EQ(t.size(0), w->size(0)) << name << ": one per output";
        for (int64_t k = 0; k < t.numel(); ++k) EXPECT_EQ(t.f32()[k], 0.0f) << name;
      } else if (conv1d) {
        ASSERT_EQ(t.shape(), (Shape{mine->size(1), mine->size(0)})) << name;
        for (int64_t r = 0; r < mine->size(0); ++r)
          for (int64_t k = 0; k < mine->size(1); ++k)
            ASSERT_EQ(t.f32()[k * mine->size(0) + r], mine->f32()[r * mine->size(1) + k]) << name;
      } else {
        ASSERT_EQ(t.shape(), mine->shape()) << name;
        EXPECT_EQ(std::memcmp(t.raw(), mine->raw(), t.nbytes()), 0) << name;
      }
    }
    // Zero biases change nothing: a biased model reading the file gives the same logits.
    testing::TempDir dir;
    io::save_safetensors(dir.path() + "/model.safetensors", hf);
    GPTConfig with = c;
    with.bias = true;
    auto loaded = models::gpt(with, 99);
    EXPECT_TRUE(train::load_weights(dir.path() + "/model.safetensors", *loaded, /*strict=*/true).ok());
    Context ctx(Device::cpu());
    Tensor ids = Tensor::empty(Shape{2, 8}, DType::I32);
    for (int64_t i = 0; i < 16; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 5 + 2) % 11);
    const Tensor want = testing::clone(m->forward(ids, ctx));
    EXPECT_LT(rel_diff(loaded->forward(ids, ctx).f32(), want.f32(), want.numel()), 1e-6) << "bias " << bias;
    if (bias) continue;
    // The model's own configuration reads its export back (the zero biases dropped), bit for bit.
    auto back = models::gpt(c, 98);
    EXPECT_TRUE(train::load_weights(dir.path() + "/model.safetensors", *back, /*strict=*/true).ok());
    EXPECT_TRUE(testing::same_bits(back->forward(ids, ctx), want));
    // A bias that is not zero has nowhere to go.
    auto changed = hf;
    for (auto& [name, t] : changed)
      if (name == "transformer.h.1.mlp.c_fc.bias") t.f32()[3] = 0.25f;
    io::save_safetensors(dir.path() + "/nonzero.safetensors", changed);
    testing::expect_user_error([&] { train::load_weights(dir.path() + "/nonzero.safetensors", *back, true); },
                               {"transformer.h.1.mlp.c_fc.bias is not zero: a model with bias=false"});
  }
}

// Generation with the key-value cache draws the tokens that running the whole
// context for each token draws (nanoGPT's way, kv_cache off), through and
// past block_size, where the window slides and the cache is rebuilt.
TEST(GPTGenerate, KeyValueCacheDrawsTheTokensOfTheWholeContext) {
  auto m = models::gpt(small(), 23);
  Context ctx(Device::cpu());
  models::SampleOptions o;
  o.max_new_tokens = 20;  // 3 + 20 > block_size 8
  o.temperature = 1.0;
  o.top_k = 0;
  for (uint64_t seed : {1, 2, 3}) {
    o.seed = seed;
    o.kv_cache = true;
    const std::vector<int32_t> cached = models::generate(*m, ctx, {3, 1, 4}, o);
    o.kv_cache = false;
    EXPECT_EQ(cached, models::generate(*m, ctx, {3, 1, 4}, o)) << "seed " << seed;
  }
  EXPECT_EQ(m->decoded(), 0) << "generate ends its sequence";
}

// A vocabulary limit (a model padded past its tokenizer's tokens) draws
// among the first tokens only, and each of them (4 of 11 tokens at
// temperature 4, every token allowed, 300 draws); top-k picks among them.
TEST(GPTGenerate, AVocabularyLimitDrawsOnlyTheFirstTokens) {
  auto m = models::gpt(small(), 25);
  Context ctx(Device::cpu());
  models::SampleOptions o;
  o.max_new_tokens = 300;
  o.temperature = 4;
  o.top_k = 0;
  const std::vector<int32_t> free = models::generate(*m, ctx, {3, 1}, o);
  EXPECT_TRUE(std::any_of(free.begin(), free.end(), [](int32_t t) { return t >= 4; })) << "unlimited: any token";
  o.vocab_limit = 4;
  const std::vector<int32_t> limited = models::generate(*m, ctx, {3, 1}, o);
  std::vector<int> seen(11);
  for (int32_t t : limited) ++seen[static_cast<size_t>(t)];
  for (int t = 0; t < 11; ++t) EXPECT_EQ(seen[static_cast<size_t>(t)] > 0, t < 4) << "token " << t;
  o.top_k = 2;  // top-k among the allowed ones
  const std::vector<int32_t> top = models::generate(*m, ctx, {3, 1}, o);
  EXPECT_TRUE(std::all_of(top.begin(), top.end(), [](int32_t t) { return t < 4; }));
  o.vocab_limit = 12;
  EXPECT_EQ(error_of([&] { models::generate(*m, ctx, {3, 1}, o); }),
            "the vocabulary limit 12 exceeds the model's vocab_size 11");
  o.vocab_limit = -1;
  EXPECT_EQ(error_of([&] { models::generate(*m, ctx, {3, 1}, o); }),
            "the vocabulary limit must be non-negative (0: none), got -1");
}

TEST(GPTGenerate, TopOneIsGreedyAndASeedRepeats) {
  auto m = models::gpt(small(), 21);
  Context ctx(Device::cpu());
  const std::vector<int32_t> prompt = {3, 1, 4};
  models::SampleOptions greedy;
  greedy.max_new_tokens = 9;  // runs past block_size 8: the context is cropped
  greedy.top_k = 1;
  const std::vector<int32_t> got = models::generate(*m, ctx, prompt, greedy);
  ASSERT_EQ(got.size(), 9u);
  std::vector<int32_t> ctxt = prompt;
  for (int32_t tok : got) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(ctxt.size()), 8);
    Tensor x = Tensor::empty(Shape{1, t}, DType::I32);
    std::copy(ctxt.end() - t, ctxt.end(), x.data<int32_t>());
    const Tensor logits = m->forward(x, ctx);
    const float* last = logits.f32() + (t - 1) * 11;
    EXPECT_EQ(tok, std::max_element(last, last + 11) - last);
    ctxt.push_back(tok);
  }
  models::SampleOptions o;
  o.max_new_tokens = 50;
  o.temperature = 1.5;
  o.seed = 4;
  std::vector<int32_t> streamed;
  const auto a = models::generate(*m, ctx, prompt, o), b = models::generate(*m, ctx, prompt, o, [&](int32_t id) {
    streamed.push_back(id);
  });
  EXPECT_EQ(a, b);
  EXPECT_EQ(streamed, a) << "each token passed on as it is drawn";
  for (int32_t tok : a) EXPECT_TRUE(tok >= 0 && tok < 11);
  o.seed = 5;
  EXPECT_NE(models::generate(*m, ctx, prompt, o), a) << "another seed, other draws";
  o.temperature = 0;
  EXPECT_EQ(error_of([&] { models::generate(*m, ctx, prompt, o); }), "temperature must be positive and finite, got 0");
  EXPECT_EQ(error_of([&] { models::generate(*m, ctx, {}, greedy); }), "generation needs a prompt of at least one token");
  // A temperature whose reciprocal overflows still draws: the likeliest token, every time.
  models::SampleOptions cold = greedy;
  cold.top_k = 0;
  cold.temperature = 1e-320;
  cold.seed = 6;
  EXPECT_EQ(models::generate(*m, ctx, prompt, cold), got);
  // Non-finite logits (a checkpoint of NaN weights) are an error, not a draw.
  Tensor& w = m->arenas().params;
  std::fill(w.f32(), w.f32() + w.numel(), std::nanf(""));
  EXPECT_NE(error_of([&] { models::generate(*m, ctx, prompt, greedy); }).find("the model's logits are not finite"),
            std::string::npos);
}

}  // namespace
}  // namespace fanout
