// GPT-2's byte-level BPE: the files, the pre-tokenizer's pattern, the merges.
#include "runtime/data/bpe.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/data/unicode_tables.h"
#include "runtime/data/utf8.h"
#include "runtime/io/file_io.h"

namespace fanout::data {

namespace {

constexpr size_t kMaxTokens = 65536;  // ids are stored as uint16

// GPT-2's bytes_to_unicode: the code point that spells byte b in the files.
// Printable Latin-1 bytes spell themselves; the other 68 take 256, 257, ...
struct ByteAlphabet {
  uint32_t cp[256] = {};
  int16_t byte_of[324];  // code point -> byte, -1 for none
  ByteAlphabet() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[b] = printable ? b : next++;
      byte_of[cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

enum Class : uint8_t { kOther, kLetter, kNumber, kSpace };

template <size_t N>
bool in_ranges(const uint32_t (&r)[N][2], uint32_t cp) {
  const auto it = std::upper_bound(std::begin(r), std::end(r), cp, [](uint32_t c, const uint32_t* row) { return c < row[0]; });
  return it != std::begin(r) && cp <= (*(it - 1))[1];
}

// Unicode's White_Space property (the pattern's \s), letters (L) and numbers (N).
Class classify(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return kSpace;
  if (cp < 0x80) {
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return kLetter;
    return cp >= '0' && cp <= '9' ? kNumber : kOther;
  }
  if (in_ranges(unicode::kLetters, cp)) return kLetter;
  return in_ranges(unicode::kNumbers, cp) ? kNumber : kOther;
}

struct Char {
  uint32_t cp = 0;
  size_t len = 0;
  Class cls = kOther;
};
Char char_at(std::string_view text, size_t i) {  // text is valid UTF-8
  Char c;
  c.len = utf8_next(text, i, c.cp);
  FANOUT_CHECK(c.len > 0) << "bpe: not UTF-8 at byte " << i << " (checked before encoding)";
  c.cls = classify(c.cp);
  return c;
}

// The end of the piece GPT-2's pattern matches at text[i] (i < end):
// '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t piece_end(std::string_view text, size_t i, size_t end) {
  const Char c = char_at(text, i);
  if (c.cp == '\'' && i + 1 < end) {
    const char a = text[i + 1];
    if (a == 's' || a == 'd' || a == 'm' || a == 't') return i + 2;
    const char b = i + 2 < end ? text[i + 2] : '\0';
    if ((a == 'l' && b == 'l') || (a == 'v' && b == 'e') || (a == 'r' && b == 'e')) return i + 3;
  }
  for (const Class x : {kLetter, kNumber, kOther}) {
    size_t j = i;
    if (c.cp == ' ' && i + 1 < end && char_at(text, i + 1).cls == x) j = i + 1;
    else if (c.cls != x) continue;
    while (j < end) {
      const Char d = char_at(text, j);
      if (d.cls != x) break;
      j += d.len;
    }
    return j;
  }
  // Whitespace: the run, less its last character when a non-space follows
  // and the run is longer than one.
  size_t j = i, last = i;
  while (j < end) {
    const Char d = char_at(text, j);
    if (d.cls != kSpace) break;
    last = j;
    j += d.len;
  }
  return j == end || last == i ? j : last;
}

uint64_t pair_key(int32_t a, int32_t b) { return static_cast<uint64_t>(a) << 32 | static_cast<uint32_t>(b); }

std::pair<std::string, std::string> find_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  FANOUT_USER_CHECK(fs::is_directory(dir, ec))
      << "tokenizer " << dir << (fs::exists(dir, ec) ? " is not a directory" : " does not exist");
  for (const auto& [vocab, merges] : {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}})
    if (fs::exists(dir + "/" + vocab, ec) && fs::exists(dir + "/" + merges, ec))
      return {dir + "/" + vocab, dir + "/" + merges};
  FANOUT_FAIL() << "tokenizer " << dir
                << " has neither vocab.json and merges.txt (Hugging Face's names) nor encoder.json and vocab.bpe "
                   "(OpenAI's) of a byte-level BPE such as GPT-2's";
}

}  // namespace

std::shared_ptr<const Bpe> Bpe::load(const std::string& dir) {
  const auto [vocab_path, merges_path] = find_files(dir);
  const nlohmann::json j =
      nlohmann::json::parse(io::read_file(vocab_path, "tokenizer vocabulary", 1 << 26), nullptr, false);
  FANOUT_USER_CHECK(!j.is_discarded() && j.is_object() && !j.empty())
      << vocab_path << " is not a tokenizer vocabulary (a JSON object of token: id)";
  FANOUT_USER_CHECK(j.size() <= kMaxTokens)
      << vocab_path << " has " << j.size() << " tokens, more than uint16 token files hold (" << kMaxTokens << ")";
  std::vector<std::string> tokens(j.size());
  std::vector<bool> seen(j.size());
  for (const auto& [token, id] : j.items()) {
    FANOUT_USER_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                      id.get<int64_t>() < static_cast<int64_t>(j.size()) && !seen[id.get<size_t>()])
        << vocab_path << ": the ids are not 0.." << j.size() - 1 << " each used once (token "
        << io::detail::quoted(token, false) << " has " << id.dump() << ")";
    seen[id.get<size_t>()] = true;
    tokens[id.get<size_t>()] = token;
  }
  const std::string text = io::read_file(merges_path, "tokenizer merges", 1 << 26);
  std::vector<std::string> merges;
  for (size_t at = 0; at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(at, nl - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty() && !(at == 0 && line.rfind("#version", 0) == 0)) merges.push_back(std::move(line));
    at = nl + 1;
  }
  return from_lists(std::move(tokens), std::move(merges), "tokenizer " + dir);
}

std::shared_ptr<const Bpe> Bpe::from_lists(std::vector<std::string> tokens, std::vector<std::string> merges,
                                           const std::string& what) {
  FANOUT_USER_CHECK(!tokens.empty() && tokens.size() <= kMaxTokens)
      << what << ": a tokenizer needs 1.." << kMaxTokens << " tokens, got " << tokens.size();
  std::shared_ptr<Bpe> b(new Bpe());
  const ByteAlphabet& abc = alphabet();
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string bytes;
    for_utf8_chars(tokens[i], what + ": token " + std::to_string(i), "", [&](size_t, size_t, uint32_t cp) {
      FANOUT_USER_CHECK(cp < 324 && abc.byte_of[cp] >= 0)
          << what << ": token " << i << " " << io::detail::quoted(tokens[i], false)
          << " is not spelled in the byte-level alphabet (U+" << std::hex << cp << std::dec << ")";
      bytes += static_cast<char>(abc.byte_of[cp]);
    });
    FANOUT_USER_CHECK(!bytes.empty()) << what << ": token " << i << " is empty";
    FANOUT_USER_CHECK(id_of.emplace(tokens[i], static_cast<int32_t>(i)).second)
        << what << ": token " << io::detail::quoted(tokens[i], false) << " is listed twice";
    b->bytes_.push_back(std::move(bytes));
  }
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const auto it = id_of.find(utf8_encode(abc.cp[byte]));
    FANOUT_USER_CHECK(it != id_of.end()) << what << ": byte " << byte << " has no token";
    b->byte_id_[byte] = it->second;
  }
  std::vector<bool> made(tokens.size());
  for (size_t k = 0; k < merges.size(); ++k) {
    const std::string& m = merges[k];
    const size_t sp = m.find(' ');
    const bool two = sp != std::string::npos && sp > 0 && sp + 1 < m.size() && m.find(' ', sp + 1) == std::string::npos;
    FANOUT_USER_CHECK(two) << what << ": merge " << k + 1 << " " << io::detail::quoted(m, false)
                           << " is not two tokens separated by a space";
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const auto l = id_of.find(left), r = id_of.find(right), out = id_of.find(left + right);
    FANOUT_USER_CHECK(l != id_of.end() && r != id_of.end() && out != id_of.end())
        << what << ": merge " << k + 1 << " " << io::detail::quoted(m, false)
        << " names a token, or makes one, that is not in the vocabulary";
    const bool first = b->pairs_.emplace(pair_key(l->second, r->second), std::pair{static_cast<int32_t>(k), out->second}).second;
    FANOUT_USER_CHECK(first) << what << ": merge " << k + 1 << " " << io::detail::quoted(m, false) << " is listed twice";
    made[static_cast<size_t>(out->second)] = true;
  }
  // Specials are whole characters: their text in UTF-8 text starts and ends on character boundaries.
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& bytes = b->bytes_[i];
    bool utf8 = !made[i] && bytes.size() > 1;
    for (size_t k = 0; utf8 && k < bytes.size();) {
      uint32_t cp = 0;
      const size_t n = utf8_next(bytes, k, cp);
      utf8 = n > 0;
      k += n;
    }
    if (utf8) b->specials_.push_back(static_cast<int32_t>(i));
  }
  b->tokens_ = std::move(tokens);
  b->merges_ = std::move(merges);
  return b;
}

std::shared_ptr<const Bpe> Bpe::bytes_only() {
  std::vector<std::string> tokens;
  for (uint32_t byte = 0; byte < 256; ++byte) tokens.push_back(utf8_encode(alphabet().cp[byte]));
  return from_lists(std::move(tokens), {}, "the byte vocabulary");
}

void Bpe::save(const std::string& dir, io::StagedFiles* staged) const {
  io::create_directories(dir, "tokenizer folder");
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tokens_.size(); ++i) vocab[tokens_[i]] = i;
  std::string m = "#version: 0.2\n";
  for (const std::string& merge : merges_) m += merge + "\n";
  io::StagedFiles own;
  io::StagedFiles& files = staged ? *staged : own;
  files.add(dir + "/vocab.json", vocab.dump());
  files.add(dir + "/merges.txt", m);
  if (!staged) own.commit();
}

struct Bpe::PieceCache {
  struct Hash {
    using is_transparent = void;  // found by string_view: no string made for a piece seen before
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // piece -> (offset, count) of its ids in `ids`: one array, not a vector a piece
  std::unordered_map<std::string, std::pair<size_t, size_t>, Hash, std::equal_to<>> at;
  std::vector<int32_t> ids;
  std::vector<int32_t> s, t;  // merge_piece's
};

void Bpe::merge_piece(std::string_view piece, PieceCache& cache, std::vector<int32_t>& out) const {
  std::vector<int32_t>& s = cache.s;
  std::vector<int32_t>& t = cache.t;
  s.clear();
  for (unsigned char c : piece) s.push_back(byte_id_[c]);
  while (s.size() > 1) {
    int32_t best = INT32_MAX, left = -1, right = -1, merged = -1;
    for (size_t k = 0; k + 1 < s.size(); ++k) {
      const auto it = pairs_.find(pair_key(s[k], s[k + 1]));
      if (it != pairs_.end() && it->second.first < best)
        best = it->second.first, left = s[k], right = s[k + 1], merged = it->second.second;
    }
    if (merged < 0) break;
    t.clear();  // every occurrence of the pair, left to right
    for (size_t k = 0; k < s.size();) {
      if (k + 1 < s.size() && s[k] == left && s[k + 1] == right) t.push_back(merged), k += 2;
      else t.push_back(s[k]), k += 1;
    }
    s.swap(t);
  }
  out.insert(out.end(), s.begin(), s.end());
}

void Bpe::encode_ordinary(std::string_view text, size_t begin, size_t end, std::vector<int32_t>& out,
                          PieceCache& cache) const {
  for (size_t i = begin; i < end;) {
    const size_t j = piece_end(text, i, end);
    const std::string_view piece = text.substr(i, j - i);
    i = j;
    if (piece.size() == 1) {  // a byte: its own token
      out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    const auto it = cache.at.find(piece);
    if (it != cache.at.end()) {
      const auto [offset, count] = it->second;
      out.insert(out.end(), cache.ids.begin() + static_cast<std::ptrdiff_t>(offset),
                 cache.ids.begin() + static_cast<std::ptrdiff_t>(offset + count));
      continue;
    }
    if (cache.at.size() >= (size_t{1} << 20)) {  // a web-scale text's pieces: bounded memory
      cache.at.clear();
      cache.ids.clear();
    }
    const size_t first = out.size();
    merge_piece(piece, cache, out);
    const size_t offset = cache.ids.size(), count = out.size() - first;
    cache.ids.insert(cache.ids.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    cache.at.emplace(std::string(piece), std::pair{offset, count});
  }
}

std::vector<int32_t> Bpe::encode(std::string_view text, bool allow_special, const std::string& what) const {
  for_utf8_chars(text, what, "", [](size_t, size_t, uint32_t) {});
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  PieceCache cache;
  // Where each special's text next occurs from `at` (found again only once passed).
  const size_t specials = allow_special ? specials_.size() : 0;
  std::vector<size_t> found(specials, 0);
  for (size_t k = 0; k < specials; ++k) found[k] = text.find(bytes_[static_cast<size_t>(specials_[k])]);
  size_t at = 0;
  while (at < text.size()) {
    // The first special token's text from `at` (the longest where two start there).
    size_t next = text.size();
    int32_t special = -1;
    for (size_t k = 0; k < specials; ++k) {
      const std::string& s = bytes_[static_cast<size_t>(specials_[k])];
      if (found[k] != std::string_view::npos && found[k] < at) found[k] = text.find(s, at);
      const size_t p = found[k];
      if (p != std::string_view::npos &&
          (p < next || (p == next && s.size() > bytes_[static_cast<size_t>(special)].size())))
        next = p, special = specials_[k];
    }
    encode_ordinary(text, at, next, out, cache);
    if (special < 0) break;
    out.push_back(special);
    at = next + bytes_[static_cast<size_t>(special)].size();
  }
  return out;
}

}  // namespace fanout::data
