// Token data for language models. Files: nanoGPT's train.bin / val.bin
// (flat uint16 token ids) and llm.c's shards (a header of 256 int32: magic
// 20240520, version 1, the token count; then uint16 ids), told apart by the
// header, memory-mapped and never read whole. A dataset over a file is its
// consecutive windows of block_size + 1 tokens overlapping by one: window i
// starts at token i * block_size; x is its first block_size tokens and y the
// same shifted by one. Plain text becomes such files as nanoGPT's
// shakespeare_char/prepare.py makes them: the sorted distinct characters
// (Unicode code points of UTF-8 text) are the vocabulary, the first 90% of
// the characters train and the rest validate; or, for any bytes, the 256
// byte values. The files and meta.json (the vocabulary) go to a cache keyed
// by the text's content, reused while it is unchanged.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/data/bpe.h"
#include "runtime/data/dataset.h"

namespace fanout::data {

// A read-only, memory-mapped token file. One-line errors (naming the file)
// for a missing or empty file, an llm.c header with another magic or
// version, a truncated header, a count that disagrees with the size, and an
// odd byte count.
class TokenFile {
 public:
  static std::shared_ptr<const TokenFile> open(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  const std::string& path() const { return path_; }
  bool llmc() const { return llmc_; }  // llm.c's header layout
  int64_t size() const { return count_; }  // tokens
  uint32_t at(int64_t i) const { return tokens_[i]; }
  const uint16_t* data() const { return tokens_; }
  // The largest of the first n tokens, read in order (with read-ahead; the
  // mapping is advised random-access again afterwards, as windows are read).
  uint16_t max_of_first(int64_t n) const;

 private:
  TokenFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
  bool llmc_ = false;
};

// Windows of a token file (see above): sample_shape (block_size) int32
// ids, targets (block_size) int32 next ids. A token at or above `vocab`
// is a one-line error naming the file and the token's position.
class TokenWindows : public Dataset {
 public:
  // One-line error when the file is shorter than one window, or when a token
  // the windows read is outside [0, vocab): found here for files of up to
  // `scan_bytes`, as its window is read for larger ones.
  static constexpr int64_t kScanBytes = int64_t{1} << 30;
  TokenWindows(std::shared_ptr<const TokenFile> file, int64_t block_size, int64_t vocab, std::string name,
               int64_t scan_bytes = kScanBytes);
  int64_t size() const override { return windows_; }
  Shape sample_shape() const override { return Shape{block_}; }
  TargetKind target_kind() const override { return TargetKind::ClassIndex; }
  Shape target_shape() const override { return Shape{block_}; }
  DType input_dtype() const override { return DType::I32; }
  void get(int64_t i, const SampleDraw& draw, void* x, void* y) const override;
  int64_t vocab() const { return vocab_; }

 private:
  void check_tokens(int64_t from, int64_t count) const;  // error at the first id >= vocab_

  std::shared_ptr<const TokenFile> file_;
  int64_t block_, vocab_, windows_;
};

// A text vocabulary: token i decodes to itos[i] (UTF-8 for characters; one
// byte for byte vocabularies; a BPE token's bytes, which may end inside a
// character that the next tokens complete).
struct Vocabulary {
  bool bytes = false;  // the 256 byte values
  std::vector<std::string> itos;
  std::shared_ptr<const Bpe> bpe;  // a byte-level BPE (bpe.h): encode applies its merges
  int64_t size() const { return static_cast<int64_t>(itos.size()); }
  // One-line error naming the first character outside the vocabulary (a
  // BPE encodes any UTF-8, its special tokens' text as those tokens).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
};

// Decoded bytes to valid UTF-8 as they come, as Python's
// bytes.decode("utf-8", "replace") gives the whole (tiktoken's decode): each
// maximal invalid subpart becomes U+FFFD; a sequence the bytes so far leave
// incomplete waits for the next ones. finish() ends the text (an incomplete
// tail becomes U+FFFD).
class Utf8Stream {
 public:
  std::string feed(const std::string& bytes);
  std::string finish();

 private:
  std::string pending_;
};

// A BPE's vocabulary: itos its tokens' bytes.
Vocabulary bpe_vocabulary(std::shared_ptr<const Bpe> bpe);

// meta.json: {"vocab_size": N} and, for text, "kind" ("char", "bytes" or
// "bpe") and "itos" (a BPE's tokens as its vocabulary file spells them,
// then "merges"). Reads return vocab_size 0 when the file is absent.
struct TokenMeta {
  int64_t vocab_size = 0;
  Vocabulary vocab;  // empty itos for token files without one (no meta.json itos, no tokenizer)
  int64_t train_tokens = 0, val_tokens = 0;  // a BPE text cache's file lengths ("splits": [train, val])
};
TokenMeta read_token_meta(const std::string& dir);
void write_token_meta(const std::string& dir, const TokenMeta& meta);
// The same JSON object, as checkpoints carry it; parse_token_meta's
// one-line errors name `what`. vocab_size may exceed the vocabulary (a
// model's padded one) where exact_size is false.
nlohmann::json token_meta_json(const TokenMeta& meta);
TokenMeta parse_token_meta(const nlohmann::json& j, const std::string& what, bool exact_size);

// The cache folder prepare_text writes into: $FANOUT_CACHE_DIR, else
// $XDG_CACHE_HOME/fanout, else $HOME/.cache/fanout.
std::string default_cache_dir();

// Makes train.bin, val.bin and meta.json from the text at `path` (bytes: the
// 256 byte values; else its characters, UTF-8; with `bpe`, that tokenizer's
// tokens of each split, as nanoGPT's shakespeare prepare.py: the text cut
// at 90% of its characters, each part encoded without special tokens) in
// cache_dir/text-<kind>-<hash of the content (and the tokenizer's)>/, unless
// they are there already; returns that folder. One-line errors: a missing or
// empty file, text that is not UTF-8 (naming the byte offset; text-bytes
// takes any bytes), more than 65536 distinct characters (without a BPE).
std::string prepare_text(const std::string& path, bool bytes, const std::string& cache_dir,
                         std::shared_ptr<const Bpe> bpe = nullptr);

// The training and validation windows of DIR/train.bin and DIR/val.bin
// (nanoGPT's names; llm.c's shards by those names too), the vocabulary from
// DIR/meta.json or `vocab` (given: at least the meta's). One-line errors
// when block_size is longer than a split allows.
struct TokenSplits {
  std::unique_ptr<TokenWindows> train, val;
  TokenMeta meta;
  std::string dir;
};
TokenSplits open_token_dir(const std::string& dir, int64_t block_size, int64_t vocab = 0);

}  // namespace fanout::data
