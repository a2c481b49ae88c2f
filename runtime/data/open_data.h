// What dp-train's --data names, opened: image sets (open_dataset), image
// files ("imagefolder:DIR", image_folder.h; "wds:DIR", tar shards, wds.h) and token
// data for language models (tokens.h): "tokens:DIR" (nanoGPT's train.bin and
// val.bin, or llm.c shards by those names, with DIR/meta.json), "text:FILE"
// (a character vocabulary, as nanoGPT's shakespeare_char) and
// "text-bytes:FILE" (the 256 byte values); with DataOptions::tokenizer, text
// is encoded by that BPE and token files without meta.json take it as their
// vocabulary.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/data/tokens.h"
#include "runtime/data/transforms.h"

namespace fanout::data {

struct DataOptions {
  uint64_t seed = 0;
  HeatmapSpec heatmap;
  int64_t block_size = 0;  // token data: the model's block_size (0: not a language model)
  int64_t vocab_size = 0;  // token data without meta.json: the model's vocabulary (0: unknown)
  std::string cache_dir;   // text: where its token files go (default_cache_dir() when empty)
  std::string tokenizer;   // text, tokens: a byte-level BPE's folder (bpe.h; empty: none)
  Augment augment;         // image files: the training pipeline, which fixes the sample size
  std::string normalize = "imagenet";  // image files: parse_normalize's spec
  bool skip_bad_samples = false;       // image files: replace unreadable ones (ImageFileDataset)
};

struct DataSplits {
  std::shared_ptr<const Dataset> train, test;  // test: the validation split of token data
  int64_t classes = 0;  // classes, landmarks, or the vocabulary a model is built for
  std::vector<std::string> warnings;
  TokenMeta tokens;     // token data: its vocabulary (vocab_size 0 otherwise)
  std::string token_dir;  // token data: the folder of its train.bin, val.bin and meta.json
  bool token_data() const { return tokens.vocab_size > 0; }
};

// One-line errors as open_dataset's, token data without a block size
// ("token data trains a language model: --model gpt:..."), a tokenizer for
// other data or beside a meta.json's vocabulary.
DataSplits open_data(const std::string& spec, const DataOptions& o);

}  // namespace fanout::data
