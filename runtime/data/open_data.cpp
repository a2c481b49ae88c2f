// open_data: image sets through open_dataset, token data through tokens.h.
#include "runtime/data/open_data.h"

#include "runtime/core/error.h"
#include "runtime/data/image_folder.h"
#include "runtime/data/wds.h"

namespace fanout::data {

DataSplits open_data(const std::string& spec, const DataOptions& o) {
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  DataSplits s;
  FANOUT_USER_CHECK(o.tokenizer.empty() || kind == "tokens" || kind == "text")
      << "--tokenizer encodes text:FILE or names the vocabulary of tokens:DIR, not data " << spec;
  if (kind == "imagefolder" || kind == "wds") {
    const ImageFolderSplits f = kind == "wds" ? open_wds(arg, o.augment, o.normalize, o.skip_bad_samples)
                                              : open_image_folder(arg, o.augment, o.normalize, o.skip_bad_samples);
    s.classes = static_cast<int64_t>(f.train->classes().size());
    s.train = f.train;
    s.test = f.val;
    s.warnings = f.warnings;
    return s;
  }
  if (kind != "tokens" && kind != "text" && kind != "text-bytes") {
    FANOUT_USER_CHECK(kind == "fashion-mnist" || kind == "cifar10" || kind == "synthetic" || kind == "keypoints3d" ||
                      kind == "synthetic3d")
        << "unknown dataset '" << spec << "' (expected fashion-mnist[:DIR], cifar10:DIR, synthetic[:N], "
        << "keypoints3d:DIR, synthetic3d[:N], imagefolder:DIR, wds:DIR, tokens:DIR, text:FILE or text-bytes:FILE)";
    auto tt = std::make_shared<TrainTest>(open_dataset(spec, o.seed, o.heatmap));
    s.train = std::shared_ptr<const Dataset>(tt, &tt->train);
    s.test = std::shared_ptr<const Dataset>(tt, &tt->test);
    s.classes = tt->train.num_classes;
    s.warnings = tt->warnings;
    return s;
  }
  FANOUT_USER_CHECK(!arg.empty()) << "bad dataset '" << spec << "': " << kind << " needs "
                                  << (kind == "tokens" ? "a directory (tokens:DIR)" : "a file (" + kind + ":FILE)");
  FANOUT_USER_CHECK(o.block_size > 0) << "dataset '" << spec
                                      << "' is token data for a language model: train it with --model gpt:...";
  const std::shared_ptr<const Bpe> bpe = o.tokenizer.empty() ? nullptr : Bpe::load(o.tokenizer);
  FANOUT_USER_CHECK(!bpe || o.vocab_size == 0 || o.vocab_size >= bpe->size())
      << "the model's vocab_size " << o.vocab_size << " is smaller than tokenizer " << o.tokenizer << "'s "
      << bpe->size() << " tokens";
  const std::string dir =
      kind == "tokens"
          ? arg
          : prepare_text(arg, kind == "text-bytes", o.cache_dir.empty() ? default_cache_dir() : o.cache_dir, bpe);
  TokenSplits t;
  const bool files_with_bpe = bpe && kind == "tokens";
  // The model's vocabulary, as checkpoints record it (meta.json's, which bounds the ids, may be smaller).
  const int64_t model_vocab = files_with_bpe ? bpe->size() : o.vocab_size;
  try {
    FANOUT_USER_CHECK(!files_with_bpe || read_token_meta(dir).vocab_size == 0)
        << "token data " << dir << " has its own vocabulary (meta.json): give no --tokenizer";
    // Ids of token files are checked against the tokenizer's tokens (a padded model's extra ones have no text).
    t = open_token_dir(dir, o.block_size, model_vocab);
    if (files_with_bpe) {
      t.meta.vocab = bpe_vocabulary(bpe);
      t.meta.vocab_size = bpe->size();
    }
  } catch (const Error& e) {
    if (kind == "tokens") throw;
    // The cache's file names mean little to whoever gave the text: name it.
    FANOUT_FAIL() << kind << ":" << arg << ", tokenized into " << dir << ": " << e.what();
  }
  s.tokens = t.meta;
  s.tokens.vocab_size = model_vocab > 0 ? model_vocab : t.train->vocab();
  s.classes = t.meta.vocab_size > 0 ? t.meta.vocab_size : t.train->vocab();
  s.train = std::move(t.train);
  s.test = std::move(t.val);
  s.token_dir = dir;
  return s;
}

}  // namespace fanout::data
