// Token files, their windows, and text made into token files.
#include "runtime/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/data/utf8.h"
#include "runtime/io/file_io.h"

namespace fanout::data {

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;
constexpr size_t kMaxVocab = 65536;  // ids are stored as uint16

std::string errno_text() { return io::detail::errno_text(errno); }

}  // namespace

std::shared_ptr<const TokenFile> TokenFile::open(const std::string& path) {
  std::shared_ptr<TokenFile> f(new TokenFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FANOUT_USER_CHECK(fd >= 0) << "cannot open token file " << path << ": " << errno_text();
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  if (rc != 0 || st.st_size == 0) {
    ::close(fd);
    FANOUT_USER_CHECK(rc == 0) << "cannot read token file " << path << ": " << io::detail::errno_text(err);
    FANOUT_FAIL() << "token file " << path << " is empty";
  }
  f->bytes_ = static_cast<size_t>(st.st_size);
  f->map_ = ::mmap(nullptr, f->bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f->map_ == MAP_FAILED) {
    f->map_ = nullptr;
    FANOUT_FAIL() << "cannot map token file " << path << ": " << errno_text();
  }
  ::madvise(f->map_, f->bytes_, MADV_RANDOM);  // windows are read in the sampler's order
  const auto* head = static_cast<const int32_t*>(f->map_);
  if (f->bytes_ >= 4 && head[0] == kLlmcMagic) {
    FANOUT_USER_CHECK(static_cast<int64_t>(f->bytes_) >= kLlmcHeaderBytes)
        << "token file " << path << ": llm.c header truncated (" << f->bytes_ << " of " << kLlmcHeaderBytes
        << " bytes)";
    FANOUT_USER_CHECK(head[1] == 1) << "token file " << path << ": llm.c version " << head[1]
                                    << " (version 1, uint16 tokens, is read)";
    const int64_t count = head[2];
    const int64_t have = (static_cast<int64_t>(f->bytes_) - kLlmcHeaderBytes) / 2;
    FANOUT_USER_CHECK(count >= 0 && count == have && (f->bytes_ - kLlmcHeaderBytes) % 2 == 0)
        << "token file " << path << ": the llm.c header says " << count << " tokens but the file holds " << have
        << (((f->bytes_ - kLlmcHeaderBytes) % 2) ? " and an odd byte" : "");
    f->llmc_ = true;
    f->count_ = count;
    f->tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(f->map_) + kLlmcHeaderBytes);
  } else {
    FANOUT_USER_CHECK(f->bytes_ % 2 == 0)
        << "token file " << path << " has an odd byte count (" << f->bytes_
        << "): not uint16 tokens (nanoGPT's .bin) nor an llm.c shard (magic " << kLlmcMagic << ")";
    f->count_ = static_cast<int64_t>(f->bytes_ / 2);
    f->tokens_ = static_cast<const uint16_t*>(f->map_);
  }
  return f;
}

uint16_t TokenFile::max_of_first(int64_t n) const {
  ::madvise(map_, bytes_, MADV_SEQUENTIAL);
  uint16_t top = 0;
  for (int64_t k = 0; k < n; ++k) top = std::max(top, tokens_[k]);
  ::madvise(map_, bytes_, MADV_RANDOM);
  return top;
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, bytes_);
}

TokenWindows::TokenWindows(std::shared_ptr<const TokenFile> file, int64_t block_size, int64_t vocab, std::string n,
                           int64_t scan_bytes)
    : file_(std::move(file)), block_(block_size), vocab_(vocab) {
  name = std::move(n);
  FANOUT_CHECK(block_size >= 1 && vocab >= 1) << "TokenWindows: block " << block_size << ", vocabulary " << vocab;
  FANOUT_USER_CHECK(file_->size() >= block_size + 1)
      << "token file " << file_->path() << " holds " << file_->size() << " tokens, shorter than one window of "
      << block_size + 1 << " (block_size " << block_size << " + 1)";
  windows_ = (file_->size() - 1) / block_size;
  // The tokens the windows read, checked once (a bad id found mid-run would end it there).
  const int64_t used = windows_ * block_ + 1;
  if (vocab_ < 65536 && used * 2 <= scan_bytes && file_->max_of_first(used) >= vocab_) check_tokens(0, used);
}

void TokenWindows::check_tokens(int64_t from, int64_t count) const {
  const uint16_t* t = file_->data();
  for (int64_t k = from; k < from + count; ++k)
    FANOUT_USER_CHECK(t[k] < vocab_) << "token file " << file_->path() << ": token " << t[k] << " at position " << k
                                     << " is outside the vocabulary [0, " << vocab_ << ")";
}

void TokenWindows::get(int64_t i, const SampleDraw&, void* x, void* y) const {
  FANOUT_USER_CHECK(0 <= i && i < windows_)
      << "sample index " << i << " is out of range for dataset '" << name << "' with " << windows_ << " windows";
  const uint16_t* t = file_->data() + i * block_;
  auto* xp = static_cast<int32_t*>(x);
  auto* yp = static_cast<int32_t*>(y);
  int32_t top = 0;
  for (int64_t k = 0; k <= block_; ++k) {
    const int32_t id = t[k];
    top = std::max(top, id);
    if (k < block_) xp[k] = id;
    if (k > 0) yp[k - 1] = id;
  }
  if (top >= vocab_) check_tokens(i * block_, block_ + 1);
}

// ---- text ----

namespace {

constexpr uint64_t kFnvStart = 14695981039346656037ull;  // FNV-1a 64's offset basis

uint64_t fnv1a(std::string_view s, uint64_t h = kFnvStart) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string_view bytes_of(const uint16_t* ids, size_t n) {
  return {reinterpret_cast<const char*>(ids), n * sizeof(uint16_t)};
}

// FNV-1a over train.bin's bytes, then val.bin's, in hex; empty when either cannot be read.
std::string entry_checksum(const std::string& dir) {
  uint64_t h = kFnvStart;
  std::vector<char> buf(size_t{1} << 20);
  for (const char* name : {"/train.bin", "/val.bin"}) {
    io::detail::Fd fd(::open((dir + name).c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0) return "";
    for (;;) {
      const ssize_t r = ::read(fd.fd, buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return "";
      if (r == 0) break;
      h = fnv1a(std::string_view(buf.data(), static_cast<size_t>(r)), h);
    }
  }
  return hex64(h);
}

// A complete cache entry: meta.json readable, and the token files holding
// the bytes its checksum was taken of (a file cut short, written over or
// damaged since makes the entry again). Its meta, or nothing.
std::optional<TokenMeta> intact_entry(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::exists(dir + "/meta.json", ec)) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(io::read_file(dir + "/meta.json", "token meta file", 1 << 26));
    const std::string sum = j.value("fnv1a64", std::string());
    TokenMeta m = parse_token_meta(j, dir + "/meta.json", /*exact_size=*/true);
    if (!sum.empty() && sum == entry_checksum(dir)) return m;
  } catch (const std::exception&) {  // made again
  }
  return std::nullopt;
}

// A cache entry: the token files whole (each renamed into place), meta.json
// last with their checksum, its presence marking the entry complete;
// processes preparing the same text at once (DDP ranks) write the same bytes.
void write_entry(const std::string& dir, const uint16_t* train, size_t n_train, const uint16_t* val, size_t n_val,
                 const TokenMeta& meta) {
  namespace fs = std::filesystem;
  try {
    io::create_directories(dir, "the text cache");
    std::error_code ec;
    // Temporaries a preparation killed mid-write left (NAME.tmp.PID.N); a live writer's are minutes old at most.
    const auto stale = fs::file_time_type::clock::now() - std::chrono::hours(1);
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code time_ec;
      if (it->path().filename().string().find(".tmp.") != std::string::npos &&
          it->last_write_time(time_ec) < stale && !time_ec)
        fs::remove(it->path(), time_ec);
    }
    io::write_file_atomic(dir + "/train.bin", bytes_of(train, n_train));
    io::write_file_atomic(dir + "/val.bin", bytes_of(val, n_val));
    nlohmann::json j = token_meta_json(meta);
    j["fnv1a64"] = hex64(fnv1a(bytes_of(val, n_val), fnv1a(bytes_of(train, n_train))));
    io::write_file_atomic(dir + "/meta.json", j.dump() + "\n");
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (text is tokenized into a cache: $FANOUT_CACHE_DIR, else " +
                "$XDG_CACHE_HOME/fanout or ~/.cache/fanout; point FANOUT_CACHE_DIR at a writable folder with room)");
  }
}

std::string read_all(const std::string& path) {
  std::string text = io::read_file(path, "text");
  FANOUT_USER_CHECK(!text.empty()) << "text " << path << " is empty";
  return text;
}

}  // namespace

std::vector<int32_t> Vocabulary::encode(const std::string& text) const {
  if (bpe) return bpe->encode(text, /*allow_special=*/true, "the prompt");
  std::vector<int32_t> out;
  if (bytes) {
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::map<std::string, int32_t> stoi;
  for (size_t i = 0; i < itos.size(); ++i) stoi.emplace(itos[i], static_cast<int32_t>(i));
  for_utf8_chars(text, "the prompt", "", [&](size_t i, size_t n, uint32_t) {
    const std::string ch = text.substr(i, n);
    const auto it = stoi.find(ch);
    FANOUT_USER_CHECK(it != stoi.end()) << "the character " << io::detail::quoted(ch, false)
                                        << " is not in the model's vocabulary of " << itos.size() << " characters";
    out.push_back(it->second);
  });
  return out;
}

std::string Vocabulary::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    FANOUT_USER_CHECK(id >= 0 && id < size()) << "token " << id << " is outside the vocabulary [0, " << size() << ")";
    out += itos[static_cast<size_t>(id)];
  }
  return out;
}

Vocabulary bpe_vocabulary(std::shared_ptr<const Bpe> bpe) {
  Vocabulary v;
  for (int32_t i = 0; i < bpe->size(); ++i) v.itos.push_back(bpe->bytes(i));
  v.bpe = std::move(bpe);
  return v;
}

TokenMeta parse_token_meta(const nlohmann::json& j, const std::string& what, bool exact_size) {
  FANOUT_USER_CHECK(j.is_object() && j.contains("vocab_size") && j["vocab_size"].is_number_integer() &&
                    j["vocab_size"].get<int64_t>() >= 1 && j["vocab_size"].get<int64_t>() <= static_cast<int64_t>(kMaxVocab))
      << what << " is not a token meta file ({\"vocab_size\": N, ...} with N in 1.." << kMaxVocab << ")";
  TokenMeta m;
  m.vocab_size = j["vocab_size"].get<int64_t>();
  const auto strings = [&](const char* key) {
    const auto it = j.find(key);
    bool ok = it != j.end() && it->is_array();
    for (size_t i = 0; ok && i < it->size(); ++i) ok = (*it)[i].is_string();
    FANOUT_USER_CHECK(ok) << what << ": " << key << " must list strings";
    return it->get<std::vector<std::string>>();
  };
  const std::string kind = j.value("kind", std::string());
  if (kind == "bytes") {
    m.vocab.bytes = true;
    for (int b = 0; b < 256; ++b) m.vocab.itos.emplace_back(1, static_cast<char>(b));
  } else if (kind == "bpe") {
    m.vocab = bpe_vocabulary(Bpe::from_lists(strings("itos"), strings("merges"), what));
    const auto splits = j.find("splits");
    if (splits != j.end() && splits->is_array() && splits->size() == 2 && (*splits)[0].is_number_integer() &&
        (*splits)[1].is_number_integer())
      m.train_tokens = (*splits)[0].get<int64_t>(), m.val_tokens = (*splits)[1].get<int64_t>();
  } else if (j.contains("itos")) {
    m.vocab.itos = strings("itos");
  }
  FANOUT_USER_CHECK(m.vocab.itos.empty() || (exact_size ? m.vocab_size == m.vocab.size() : m.vocab_size >= m.vocab.size()))
      << what << ": vocab_size " << m.vocab_size << " does not fit its vocabulary of " << m.vocab.size() << " tokens";
  return m;
}

nlohmann::json token_meta_json(const TokenMeta& meta) {
  nlohmann::json j = {{"vocab_size", meta.vocab_size}};
  if (meta.vocab.bytes) {
    j["kind"] = "bytes";  // token b is byte b (bytes past 0x7f are no UTF-8 strings of their own)
  } else if (meta.vocab.bpe) {
    j["kind"] = "bpe";
    j["itos"] = meta.vocab.bpe->tokens();
    j["merges"] = meta.vocab.bpe->merges();
    if (meta.train_tokens > 0) j["splits"] = {meta.train_tokens, meta.val_tokens};
  } else if (!meta.vocab.itos.empty()) {
    j["kind"] = "char";
    j["itos"] = meta.vocab.itos;
  }
  return j;
}

TokenMeta read_token_meta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  const nlohmann::json j = nlohmann::json::parse(io::read_file(path, "token meta file", 1 << 26), nullptr, false);
  FANOUT_USER_CHECK(!j.is_discarded()) << path << " is not a token meta file (not JSON)";
  return parse_token_meta(j, path, /*exact_size=*/true);
}

void write_token_meta(const std::string& dir, const TokenMeta& meta) {
  const std::string text = token_meta_json(meta).dump() + "\n";
  io::write_file_atomic(dir + "/meta.json", text);
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("FANOUT_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/fanout";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/fanout";
  return "/tmp/fanout-cache";
}

namespace {

// nanoGPT's shakespeare prepare.py: the text cut at 90% of its characters,
// each part encoded without special tokens.
std::string prepare_bpe_text(const std::string& path, const std::string& text, const std::shared_ptr<const Bpe>& bpe,
                             const std::string& cache_dir) {
  std::string spelled;
  for (const std::string& t : bpe->tokens()) spelled += t + '\n';
  for (const std::string& m : bpe->merges()) spelled += m + '\n';
  const std::string dir = cache_dir + "/text-bpe-v1-" + hex64(fnv1a(text)) + "-" + hex64(fnv1a(spelled));  // v1: this encoder; a change to it, v2
  if (const auto m = intact_entry(dir); m && m->train_tokens > 0) return dir;
  size_t chars = 0;
  for_utf8_chars(text, "text " + path, " (text-bytes:FILE reads any bytes)", [&](size_t, size_t, uint32_t) { ++chars; });
  const size_t cut_chars = static_cast<size_t>(static_cast<double>(chars) * 0.9);
  size_t cut = 0;  // the byte where character cut_chars starts
  for (size_t c = 0; c < cut_chars; ++c) {
    uint32_t cp = 0;
    cut += utf8_next(text, cut, cp);
  }
  TokenMeta meta;
  meta.vocab = bpe_vocabulary(bpe);
  meta.vocab_size = bpe->size();
  // A large text takes a while (seconds to minutes a GiB on one core, by how often its words repeat): say so.
  const bool say = text.size() >= (size_t{64} << 20);
  if (say)
    std::fprintf(stderr, "fanout: encoding text %s (%.0f MiB) with its tokenizer...\n", path.c_str(),
                 static_cast<double>(text.size()) / (1 << 20));
  const auto start = std::chrono::steady_clock::now();
  std::vector<uint16_t> split[2];
  for (int part = 0; part < 2; ++part) {
    const std::string_view whole(text);
    const std::vector<int32_t> ids = bpe->encode(part == 0 ? whole.substr(0, cut) : whole.substr(cut), false, "text " + path);
    split[part].assign(ids.begin(), ids.end());
  }
  if (say)
    std::fprintf(stderr, "fanout: %zu tokens in %.1f s\n", split[0].size() + split[1].size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  meta.train_tokens = static_cast<int64_t>(split[0].size());
  meta.val_tokens = static_cast<int64_t>(split[1].size());
  write_entry(dir, split[0].data(), split[0].size(), split[1].data(), split[1].size(), meta);
  return dir;
}

}  // namespace

std::string prepare_text(const std::string& path, bool bytes, const std::string& cache_dir,
                         std::shared_ptr<const Bpe> bpe) {
  const std::string text = read_all(path);
  if (bpe) return prepare_bpe_text(path, text, bpe, cache_dir);
  const std::string dir = cache_dir + "/text-" + (bytes ? "bytes-" : "char-") + hex64(fnv1a(text));
  if (intact_entry(dir)) return dir;
  TokenMeta meta;
  std::vector<uint16_t> ids;
  if (bytes) {
    meta.vocab.bytes = true;
    for (int b = 0; b < 256; ++b) meta.vocab.itos.emplace_back(1, static_cast<char>(b));
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
  } else {
    // Two passes over the text by code point (a table of every code point, not a string per character:
    // memory stays the text and its ids): the characters seen, sorted as Python sorts str, then the ids.
    constexpr uint32_t kCodePoints = 0x110000;
    std::vector<int32_t> id(kCodePoints, -1);
    std::vector<size_t> first(kCodePoints, 0);  // where each character is first seen: its bytes for itos
    size_t count = 0, distinct = 0;
    const std::string what = "text " + path;
    for_utf8_chars(text, what, " (text-bytes:FILE reads any bytes)", [&](size_t i, size_t, uint32_t cp) {
      if (id[cp] < 0) id[cp] = 0, first[cp] = i, ++distinct;
      ++count;
    });
    FANOUT_USER_CHECK(distinct <= kMaxVocab)
        << "text " << path << " has " << distinct << " distinct characters, more than uint16 tokens hold";
    for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
      if (id[cp] < 0) continue;
      id[cp] = static_cast<int32_t>(meta.vocab.itos.size());
      uint32_t unused = 0;
      meta.vocab.itos.push_back(text.substr(first[cp], utf8_next(text, first[cp], unused)));
    }
    ids.reserve(count);
    for_utf8_chars(text, what, "", [&](size_t, size_t, uint32_t cp) { ids.push_back(static_cast<uint16_t>(id[cp])); });
  }
  meta.vocab_size = meta.vocab.size();
  // After tokenizing: a text that fails leaves no empty entry. nanoGPT:
  // train = data[:int(n * 0.9)], val = the rest.
  const size_t n = ids.size(), cut = static_cast<size_t>(static_cast<double>(n) * 0.9);
  write_entry(dir, ids.data(), cut, ids.data() + cut, n - cut, meta);
  return dir;
}

std::string Utf8Stream::feed(const std::string& bytes) {
  pending_ += bytes;
  static const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    const unsigned b = p[i];
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // The sequence's length and its second byte's range (Unicode's well-formed table).
    size_t need = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) need = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    if (need == 0) {  // not a lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = 1;
    for (; j < need && i + j < n; ++j) {
      const unsigned c = p[i + j];
      if (c < (j == 1 ? lo : 0x80) || c > (j == 1 ? hi : 0xBF)) break;
    }
    if (j == need) {
      out.append(pending_, i, need);
      i += need;
    } else if (i + j == n) {
      break;  // a valid start the next bytes may complete
    } else {
      out += kReplacement;  // the maximal subpart, then the byte that broke it is read afresh
      i += j;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  const bool tail = !pending_.empty();
  pending_.clear();
  return tail ? "\xEF\xBF\xBD" : "";
}

TokenSplits open_token_dir(const std::string& dir, int64_t block_size, int64_t vocab) {
  TokenSplits s;
  s.dir = dir;
  std::error_code ec;
  FANOUT_USER_CHECK(std::filesystem::is_directory(dir, ec))
      << "token data " << dir << (std::filesystem::exists(dir, ec) ? " is not a directory" : " does not exist");
  s.meta = read_token_meta(dir);
  FANOUT_USER_CHECK(vocab > 0 || s.meta.vocab_size > 0)
      << "token data " << dir << " has no meta.json giving vocab_size: give the model's vocab_size";
  FANOUT_USER_CHECK(vocab == 0 || s.meta.vocab_size == 0 || vocab >= s.meta.vocab_size)
      << "the model's vocab_size " << vocab << " is smaller than the data's " << s.meta.vocab_size << " (" << dir
      << "/meta.json)";
  // Ids are checked against meta.json's vocab_size where it gives one (a model's may be larger: padded).
  const int64_t v = s.meta.vocab_size > 0 ? s.meta.vocab_size : vocab;
  s.train = std::make_unique<TokenWindows>(TokenFile::open(dir + "/train.bin"), block_size, v, "tokens/train");
  s.val = std::make_unique<TokenWindows>(TokenFile::open(dir + "/val.bin"), block_size, v, "tokens/val");
  return s;
}

}  // namespace fanout::data
