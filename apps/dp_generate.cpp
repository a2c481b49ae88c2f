// dp-generate: text from a GPT that dp-train trained on text (nanoGPT's
// sample.py). The checkpoint (or best.safetensors) names the model and holds
// the run's vocabulary; the prompt is encoded with it, new tokens are drawn
// (models/zoo/gpt.h: temperature, top-k, a seeded generator) and the text
// is printed, prompt first. --export-hf writes the model and its tokenizer as
// Hugging Face's GPT-2 files instead.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli_main.h"
#include "models/zoo/gpt.h"
#include "models/zoo/zoo.h"
#include "runtime/core/context.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/data/tokens.h"
#include "runtime/io/file_io.h"
#include "runtime/io/safetensors.h"
#include "runtime/train/checkpoint.h"

namespace po = boost::program_options;
using namespace fanout;

namespace {

struct Options {
  std::string checkpoint, weights, model, tokenizer, prompt = "\n", prompt_file, device = "cpu", export_hf;
  models::SampleOptions sample;
  int num_samples = 1;
  std::string seed;
  bool prompt_given = false, no_kv_cache = false;
};

bool parse(int argc, char** argv, Options& o) {
  po::options_description desc(
      "dp-generate: text from a GPT trained by dp-train on text:FILE or text-bytes:FILE, or with --tokenizer "
      "(nanoGPT's sample.py)\n\n"
      "Usage: dp-generate --checkpoint FILE [options]\n"
      "       dp-generate --weights FILE --model gpt:... --tokenizer DIR [options]\n"
      "       dp-generate --checkpoint FILE --export-hf DIR (or --weights ...: Hugging Face's GPT-2 files)\n\nOptions");
  // clang-format off
  desc.add_options()
    ("help,h", "print this help and exit")
    ("checkpoint", po::value(&o.checkpoint), "a dp-train checkpoint or best.safetensors of a GPT")
    ("weights", po::value(&o.weights),
     "instead of --checkpoint: a GPT's safetensors (ours, nanoGPT's names, or Hugging Face's GPT-2 layout), with "
     "--model and --tokenizer")
    ("model", po::value(&o.model), "with --weights: the GPT they are, gpt:PRESET,KEY=VALUE,... as dp-train's")
    ("tokenizer", po::value(&o.tokenizer),
     "a byte-level BPE's folder (vocab.json and merges.txt, or encoder.json and vocab.bpe): with --weights, or for "
     "a checkpoint trained on token files without a vocabulary")
    ("prompt", po::value(&o.prompt)->default_value(o.prompt, "\"\\n\""), "text the samples continue")
    ("prompt-file", po::value(&o.prompt_file), "instead of --prompt: the text of FILE, as it is (- reads stdin)")
    ("max-new-tokens", po::value(&o.sample.max_new_tokens)->default_value(o.sample.max_new_tokens), "tokens to draw")
    ("temperature", po::value(&o.sample.temperature)->default_value(o.sample.temperature, "0.8"),
     "divides the logits: below 1 sharper, above 1 more random")
    ("top-k", po::value(&o.sample.top_k)->default_value(o.sample.top_k), "draw among the K likeliest tokens (0: all)")
    ("seed", po::value(&o.seed)->default_value(std::to_string(o.sample.seed)), "the same seed prints the same text")
    ("num-samples", po::value(&o.num_samples)->default_value(o.num_samples), "samples, each from seed + its index")
    ("no-kv-cache", po::bool_switch(&o.no_kv_cache),
     "run the whole context for every token, as nanoGPT's sample.py does (slower; a draw may differ only where "
     "logits that differ in their last bits decide it)")
    ("device", po::value(&o.device)->default_value(o.device), "cpu, or a CUDA index (0)")
    ("export-hf", po::value(&o.export_hf),
     "draw nothing: write the model into DIR as Hugging Face's GPT2LMHeadModel (model.safetensors, config.json) "
     "with its tokenizer (vocab.json, merges.txt, tokenizer_config.json) where it has a byte-level one");
  // clang-format on
  po::variables_map vm;
  po::store(apps::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\nExamples:\n  dp-generate --checkpoint run/best.safetensors --prompt 'ROMEO:' --seed 7\n"
              << "  dp-generate --weights gpt2/model.safetensors --model gpt:gpt2,vocab_size=50257 --tokenizer gpt2 "
                 "--prompt 'Hello'\n"
              << "  dp-generate --checkpoint run/best.safetensors --export-hf run/hf\n";
    return false;
  }
  po::notify(vm);
  for (const char* path : {"checkpoint", "weights", "model", "tokenizer", "prompt-file", "export-hf"})
    FANOUT_USER_CHECK(!vm.count(path) || !vm[path].as<std::string>().empty()) << "--" << path << " is empty";
  FANOUT_USER_CHECK(o.checkpoint.empty() != o.weights.empty()) << "give --checkpoint FILE or --weights FILE (one)";
  FANOUT_USER_CHECK(o.weights.empty() || (!o.model.empty() && !o.tokenizer.empty()))
      << "--weights needs --model gpt:... and --tokenizer DIR (the weights carry neither)";
  FANOUT_USER_CHECK(o.model.empty() || !o.weights.empty()) << "--model is for --weights (a checkpoint names its model)";
  o.prompt_given = !vm["prompt"].defaulted();
  FANOUT_USER_CHECK(!o.prompt_given || o.prompt_file.empty()) << "give --prompt or --prompt-file, not both";
  for (const char* drawing :
       {"prompt", "prompt-file", "max-new-tokens", "temperature", "top-k", "seed", "num-samples", "device"})
    FANOUT_USER_CHECK(o.export_hf.empty() || !vm.count(drawing) || vm[drawing].defaulted())
        << "--export-hf draws nothing: give no --" << drawing;
  FANOUT_USER_CHECK(o.export_hf.empty() || !o.no_kv_cache) << "--export-hf draws nothing: give no --no-kv-cache";
  o.sample.seed = apps::parse_seed(o.seed);
  o.sample.kv_cache = !o.no_kv_cache;
  FANOUT_USER_CHECK(o.num_samples >= 1) << "--num-samples must be positive, got " << o.num_samples;
  return true;
}

// The model, the vocabulary it was built for and the one to encode and decode
// with: a dp-train checkpoint's, or --weights' --model and --tokenizer.
struct Trained {
  std::string model;
  data::Vocabulary vocab;
  int64_t data_vocab = 0;  // the vocab_size the data gave the model (a preset may pad it)
};

Trained read_trained(const Options& o) {
  Trained t;
  nlohmann::json tokens;  // a checkpoint's record of its token data
  if (!o.weights.empty()) {
    t.model = o.model;
  } else {
    const std::string& path = o.checkpoint;
    const io::TensorFile f = io::load_safetensors(path);
    const auto cfg = f.metadata.find("config");
    const nlohmann::json config =
        cfg == f.metadata.end() ? nlohmann::json() : nlohmann::json::parse(cfg->second, nullptr, false);
    FANOUT_USER_CHECK(config.is_object() && config.contains("model") && config["model"].is_string())
        << path << " is not a checkpoint of dp-train (no training configuration in its metadata; --weights reads "
                   "weights alone)";
    t.model = config["model"].get<std::string>();
    FANOUT_USER_CHECK(models::is_gpt(t.model)) << path << " holds model " << t.model << ", not a GPT";
    if (config.contains("tokens") && config["tokens"].is_object()) tokens = config["tokens"];
    const bool own = tokens.contains("kind");
    FANOUT_USER_CHECK(own || !o.tokenizer.empty())
        << path << " was not trained on text (text:FILE or text-bytes:FILE) or with --tokenizer: it has no "
                   "vocabulary to decode with (give --tokenizer DIR)";
    FANOUT_USER_CHECK(!own || o.tokenizer.empty()) << path << " carries its own vocabulary: give no --tokenizer";
    if (own) {
      t.vocab = data::parse_token_meta(tokens, path + " (its metadata's tokens)", false).vocab;
      t.data_vocab = t.vocab.size();
      return t;
    }
  }
  t.vocab = data::bpe_vocabulary(data::Bpe::load(o.tokenizer));
  // Token files: the model took its vocabulary from their meta.json (or the model's name).
  const nlohmann::json n = tokens.is_object() ? tokens.value("vocab_size", nlohmann::json()) : nlohmann::json();
  t.data_vocab = n.is_number_integer() ? n.get<int64_t>() : t.vocab.size();
  return t;
}

// Hugging Face's GPT2Config for c: exact GELU (nanoGPT's and ours, not GPT-2's
// tanh form), LayerNorm's 1e-5, the MLP 4 n_embd wide, the head tied.
nlohmann::ordered_json hf_config(const models::GPTConfig& c, const nlohmann::json& end_of_text) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.block_size;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;
  j["activation_function"] = "gelu";
  for (const char* p : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) j[p] = c.dropout;
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  j["bos_token_id"] = end_of_text;
  j["eos_token_id"] = end_of_text;
  j["torch_dtype"] = "float32";
  return j;
}


// --export-hf: the model and, for a byte-level vocabulary, its tokenizer.
void export_hf(const Options& o, models::GPT& model, const data::Vocabulary& vocab) {
  const std::shared_ptr<const data::Bpe> bpe = vocab.bpe ? vocab.bpe : vocab.bytes ? data::Bpe::bytes_only() : nullptr;
  nlohmann::json end_of_text = nullptr;  // GPT-2's <|endoftext|>, where the tokenizer has it
  if (bpe)
    for (int32_t id : bpe->specials())
      if (bpe->bytes(id) == "<|endoftext|>") end_of_text = id;
  // Tokenizer files this export does not write would be loaded beside the model by from_pretrained.
  const std::vector<std::string> written = {"vocab.json", "merges.txt", "tokenizer_config.json"};  // with a BPE
  std::string stale;
  for (const char* f : {"tokenizer.json", "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                        "tokenizer_config.json"}) {
    const bool ours = bpe && std::find(written.begin(), written.end(), f) != written.end();
    if (!ours && std::filesystem::exists(std::filesystem::path(o.export_hf) / f))
      stale += (stale.empty() ? "" : ", ") + std::string(f);
  }
  FANOUT_USER_CHECK(stale.empty()) << "--export-hf " << o.export_hf << " holds " << stale << ", which this export "
                                   << "does not write and from_pretrained would load with it: remove them, or give "
                                      "another folder";
  io::create_directories(o.export_hf, "--export-hf folder");
  const auto tensors = model.hf_state_dict();
  io::StagedFiles staged;  // every file or none: a failed export leaves the folder as it was
  io::save_safetensors(o.export_hf + "/model.safetensors", tensors, {{"format", "pt"}}, &staged);
  staged.add(o.export_hf + "/config.json", hf_config(model.config(), end_of_text).dump(2) + "\n");
  std::string files = "model.safetensors, config.json";
  if (bpe) {
    bpe->save(o.export_hf, &staged);
    nlohmann::ordered_json t;
    t["tokenizer_class"] = "GPT2Tokenizer";
    t["model_max_length"] = model.config().block_size;
    t["add_prefix_space"] = false;
    t["clean_up_tokenization_spaces"] = false;  // decode gives the tokens' bytes, nothing changed
    for (const char* k : {"bos_token", "eos_token", "unk_token"})
      t[k] = end_of_text.is_null() ? nlohmann::json() : nlohmann::json("<|endoftext|>");
    staged.add(o.export_hf + "/tokenizer_config.json", t.dump(2) + "\n");
    files += ", vocab.json, merges.txt, tokenizer_config.json";
  }
  staged.commit();
  std::printf("wrote %s: %s (%zu tensors)\n", o.export_hf.c_str(), files.c_str(), tensors.size());
  if (!bpe)
    std::printf("no tokenizer files: a character vocabulary is no byte-level BPE (its characters are in the "
                "checkpoint's metadata)\n");
}

int run(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) return 0;
  models::check_sample_options(o.sample);  // before anything is printed
  if (o.prompt_file == "-")
    o.prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  else if (!o.prompt_file.empty())
    o.prompt = io::read_file(o.prompt_file, "--prompt-file");
  FANOUT_USER_CHECK(o.model.empty() || models::is_gpt(o.model)) << "--model " << o.model << " is not a GPT (gpt:...)";
  const Trained t = read_trained(o);
  const models::GPTConfig c = models::parse_gpt_config(models::gpt_spec(t.model), t.data_vocab);
  FANOUT_USER_CHECK(t.vocab.size() <= c.vocab_size)
      << (o.tokenizer.empty() ? "the vocabulary" : "tokenizer " + o.tokenizer) << " has " << t.vocab.size()
      << " tokens, more than the model's vocab_size " << c.vocab_size;
  auto model = models::gpt(c, 0);
  train::load_weights(o.weights.empty() ? o.checkpoint : o.weights, *model, /*strict=*/true);
  if (!o.export_hf.empty()) {
    export_hf(o, *model, t.vocab);
    return 0;
  }
  const std::vector<Device> devices = parse_devices(o.device, false);
  FANOUT_USER_CHECK(devices.size() == 1) << "--device takes one device, got '" << o.device << "'";
  Context ctx(devices[0]);
  if (!devices[0].is_cpu()) model->to(devices[0], &ctx.compute());
  std::vector<int32_t> prompt;
  try {
    prompt = t.vocab.encode(o.prompt);
  } catch (const Error& e) {  // name the option, and the default when it was not given
    throw Error(std::string(!o.prompt_file.empty() ? "--prompt-file " + o.prompt_file + ": "
                            : o.prompt_given       ? "--prompt: "
                                                   : "--prompt (not given: \"\\n\"): ") +
                e.what());
  }
  for (int s = 0; s < o.num_samples; ++s) {
    models::SampleOptions so = o.sample;
    so.vocab_limit = t.vocab.size();  // a padded model's extra tokens have no text
    so.seed = o.sample.seed + static_cast<uint64_t>(s);
    // Each token as it is drawn, as valid UTF-8: a byte's or BPE token's partial character waits for the
    // next tokens, what cannot be one is U+FFFD (tiktoken's decode).
    data::Utf8Stream text;
    const auto put = [](const std::string& s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    };
    put(text.feed(o.prompt));
    models::generate(*model, ctx, prompt, so, [&](int32_t id) { put(text.feed(t.vocab.decode({id}))); });
    put(text.finish());
    std::printf("\n%s", s + 1 < o.num_samples ? "---------------\n" : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fanout::apps::cli_main("dp-generate", [&] { return run(argc, argv); });
}
