// GPT-2's byte-level byte-pair encoding (what nanoGPT's prepare.py scripts
// call through tiktoken's "gpt2"), from the tokenizer's own files: a
// vocabulary (JSON: token -> id) and a list of merges ("a b" per line, the
// first merge first). Text is cut into pieces by GPT-2's pattern
// ('s 't 're 've 'm 'll 'd, an optional space before a run of letters, of
// numbers or of other symbols, runs of whitespace, with Unicode's letter
// and number categories), each piece's bytes become the tokens of their
// byte-level characters, and merges apply lowest rank first until none
// applies. Decoding concatenates the tokens' bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fanout::io {
class StagedFiles;  // runtime/io/file_io.h
}

namespace fanout::data {

class Bpe {
 public:
  // DIR holds vocab.json and merges.txt (Hugging Face's names) or
  // encoder.json and vocab.bpe (OpenAI's). One-line errors naming the file:
  // neither pair there, a vocabulary that is not a JSON object of ids 0..N-1
  // each used once, more than 65536 tokens (ids are stored as uint16), a
  // byte without its token, a token outside the byte-level alphabet, a merge
  // line that is not two tokens, or whose parts or result are not tokens.
  static std::shared_ptr<const Bpe> load(const std::string& dir);
  // The same from the lists meta.json and checkpoints carry: `tokens` in id
  // order as the vocabulary file spells them, `merges` in rank order; `what`
  // names their source in errors.
  static std::shared_ptr<const Bpe> from_lists(std::vector<std::string> tokens, std::vector<std::string> merges,
                                               const std::string& what);
  // The 256 byte values as a BPE without merges, id b the byte b: text-bytes
  // data's vocabulary in a byte-level tokenizer's terms.
  static std::shared_ptr<const Bpe> bytes_only();
  // Writes DIR/vocab.json (token: id, in id order) and DIR/merges.txt
  // ("#version: 0.2", then the merges by rank), the files load() and Hugging
  // Face's GPT-2 tokenizers read; each atomically, DIR made if need be.
  // With `staged`, both join the files replaced together (io::StagedFiles).
  void save(const std::string& dir, io::StagedFiles* staged = nullptr) const;

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }  // the files' spelling
  const std::vector<std::string>& merges() const { return merges_; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  // Tokens that no merge makes, longer than a byte and whole UTF-8
  // characters, such as GPT-2's <|endoftext|> (ids ascending).
  const std::vector<int32_t>& specials() const { return specials_; }
  // The ids of UTF-8 `text` (one-line error naming `what` and the byte
  // offset otherwise). A special token's text becomes its id only where
  // allow_special (tiktoken's encode with allowed_special); else it is
  // encoded as ordinary text (encode_ordinary).
  std::vector<int32_t> encode(std::string_view text, bool allow_special, const std::string& what) const;

 private:
  Bpe() = default;
  struct PieceCache;  // one encode()'s pieces seen, their ids, the merge loop's buffers
  void encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<int32_t>& out,
                       PieceCache& cache) const;
  void merge_piece(std::string_view piece, PieceCache& cache, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_, merges_, bytes_;
  std::vector<int32_t> specials_;
  int32_t byte_id_[256] = {};
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> pairs_;
};

}  // namespace fanout::data
