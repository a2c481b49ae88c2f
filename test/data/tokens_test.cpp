// Token data (runtime/data/tokens.h, open_data.h): nanoGPT's flat uint16
// files and llm.c's shards read alike; windows of block_size + 1 tokens
// overlapping by one, x and y shifted by one; an epoch visits every window
// once on one loader and split over 2 or 3 ranks; every malformed file a
// one-line error naming it; text made into token files exactly as nanoGPT's
// shakespeare_char/prepare.py makes them (a Python reference run on the same
// text), a cache reused while the text is unchanged and rebuilt when it
// changes; byte vocabularies; encode and decode round trips.
#include <gtest/gtest.h>

#include <chrono>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/data/loader.h"
#include "runtime/data/open_data.h"
#include "runtime/data/sampler.h"
#include "runtime/data/tokens.h"
#include "support/dist_util.h"
#include "support/test_util.h"

namespace fanout {
namespace {

using data::TokenFile;
using data::TokenWindows;

using testing::error_of;

void write_bytes(const std::string& path, const void* p, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
}

std::vector<uint16_t> random_tokens(int64_t n, int v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<uint16_t>(rng() % static_cast<uint64_t>(v));
  return t;
}

void write_llmc(const std::string& path, const std::vector<uint16_t>& t, int32_t magic = 20240520, int32_t version = 1,
                int64_t count = -1) {
  std::vector<int32_t> head(256, 0);
  head[0] = magic;
  head[1] = version;
  head[2] = static_cast<int32_t>(count < 0 ? static_cast<int64_t>(t.size()) : count);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(head.data()), 1024);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.size() * 2));
}

TEST(TokenFiles, NanoGptAndLlmcLayoutsGiveTheSameWindows) {
  testing::TempDir dir;
  const auto t = random_tokens(1000, 50, 1);
  write_bytes(dir.path() + "/flat.bin", t.data(), t.size() * 2);
  write_llmc(dir.path() + "/shard.bin", t);
  for (const char* name : {"flat.bin", "shard.bin"}) {
    SCOPED_TRACE(name);
    auto f = TokenFile::open(dir.path() + "/" + name);
    EXPECT_EQ(f->llmc(), std::string(name) == "shard.bin");
    ASSERT_EQ(f->size(), 1000);
    TokenWindows w(f, 64, 50, "w");
    EXPECT_EQ(w.size(), 999 / 64);  // windows of 65 tokens overlapping by one
    EXPECT_EQ(w.input_dtype(), DType::I32);
    EXPECT_EQ(w.sample_shape(), Shape{64});
    std::vector<int32_t> x(64), y(64);
    for (int64_t i : {int64_t{0}, int64_t{7}, w.size() - 1}) {
      w.get(i, {}, x.data(), y.data());
      for (int64_t k = 0; k < 64; ++k) {
        ASSERT_EQ(x[k], t[i * 64 + k]) << "window " << i;
        ASSERT_EQ(y[k], t[i * 64 + k + 1]) << "window " << i;
      }
    }
  }
}

// Each window starts at a distinct multiple of block_size, so its first
// token position names it: every window seen once per epoch.
TEST(TokenFiles, AnEpochVisitsEveryWindowOnceOnAnyRankCount) {
  testing::TempDir dir;
  std::vector<uint16_t> t(2001);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i % 60000);
  write_bytes(dir.path() + "/train.bin", t.data(), t.size() * 2);
  TokenWindows w(TokenFile::open(dir.path() + "/train.bin"), 16, 60000, "w");
  ASSERT_EQ(w.size(), 125);
  for (int ranks : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::multiset<int32_t> starts;
    for (int r = 0; r < ranks; ++r) {
      data::LoaderOptions lo;
      lo.batch_size = 7;
      lo.workers = 2;
      std::unique_ptr<data::Sampler> s;
      if (ranks == 1) s = std::make_unique<data::RandomSampler>(w.size(), 3);
      else s = std::make_unique<data::DistributedSampler>(w.size(), ranks, r, true, 3, /*drop_last=*/false);
      data::DataLoader loader(w, std::move(s), lo);
      loader.start_epoch(1);
      Tensor x, y;
      while (loader.next(x, y))
        for (int64_t b = 0; b < x.size(0); ++b) starts.insert(x.data<int32_t>()[b * 16]);
    }
    // DistributedSampler pads to a multiple of the ranks by repeating the first windows.
    const size_t padded = static_cast<size_t>((125 + ranks - 1) / ranks * ranks);
    ASSERT_EQ(starts.size(), padded);
    for (int32_t i = 0; i < 125; ++i) EXPECT_GE(starts.count(i * 16), 1u) << "window " << i;
    EXPECT_EQ(std::set<int32_t>(starts.begin(), starts.end()).size(), 125u);
  }
}

TEST(TokenFiles, MalformedFilesAreOneLineErrorsNamingThem) {
  testing::TempDir dir;
  const std::string d = dir.path();
  const auto t = random_tokens(100, 20, 2);
  EXPECT_EQ(error_of([&] { TokenFile::open(d + "/none.bin"); }),
            "cannot open token file " + d + "/none.bin: No such file or directory");
  write_bytes(d + "/empty.bin", "", 0);
  EXPECT_EQ(error_of([&] { TokenFile::open(d + "/empty.bin"); }), "token file " + d + "/empty.bin is empty");
  write_bytes(d + "/odd.bin", t.data(), 77);
  EXPECT_NE(error_of([&] { TokenFile::open(d + "/odd.bin"); }).find("has an odd byte count (77)"), std::string::npos);
  write_llmc(d + "/version.bin", t, 20240520, 3);
  EXPECT_EQ(error_of([&] { TokenFile::open(d + "/version.bin"); }),
            "token file " + d + "/version.bin: llm.c version 3 (version 1, uint16 tokens, is read)");
  write_llmc(d + "/count.bin", t, 20240520, 1, 101);
  EXPECT_EQ(error_of([&] { TokenFile::open(d + "/count.bin"); }),
            "token file " + d + "/count.bin: the llm.c header says 101 tokens but the file holds 100");
  const int32_t magic = 20240520;
  write_bytes(d + "/short.bin", &magic, 4);
  EXPECT_EQ(error_of([&] { TokenFile::open(d + "/short.bin"); }),
            "token file " + d + "/short.bin: llm.c header truncated (4 of 1024 bytes)");
  // A wrong magic is read as flat tokens (no header), which then fail the vocabulary.
  write_llmc(d + "/magic.bin", t, 20240521);
  EXPECT_NE(error_of([&] { TokenWindows(TokenFile::open(d + "/magic.bin"), 8, 20, "m"); })
                .find("is outside the vocabulary [0, 20)"),
            std::string::npos);
  // An id outside the vocabulary: found when the data opens, or, past the scan's size, as its window is read.
  auto bad = t;
  bad[37] = 20;
  write_bytes(d + "/bad.bin", bad.data(), bad.size() * 2);
  const std::string at37 = "token file " + d + "/bad.bin: token 20 at position 37 is outside the vocabulary [0, 20)";
  EXPECT_EQ(error_of([&] { TokenWindows(TokenFile::open(d + "/bad.bin"), 8, 20, "b"); }), at37);
  TokenWindows wb(TokenFile::open(d + "/bad.bin"), 8, 20, "b", /*scan_bytes=*/0);
  std::vector<int32_t> x(8), y(8);
  wb.get(3, {}, x.data(), y.data());  // positions 24..32
  wb.get(5, {}, x.data(), y.data());  // 40..48
  EXPECT_EQ(error_of([&] { wb.get(4, {}, x.data(), y.data()); }), at37);
  // Past the last window (12 windows of 8 read positions 0..96): never read, no error.
  bad[37] = 1;
  bad[98] = 20;
  write_bytes(d + "/tail.bin", bad.data(), bad.size() * 2);
  TokenWindows wt(TokenFile::open(d + "/tail.bin"), 8, 20, "t");
  EXPECT_EQ(wt.size(), 12);
  wt.get(11, {}, x.data(), y.data());
  EXPECT_EQ(y[7], bad[96]);
  EXPECT_EQ(error_of([&] { TokenWindows(TokenFile::open(d + "/bad.bin"), 100, 20, "s"); }),
            "token file " + d + "/bad.bin holds 100 tokens, shorter than one window of 101 (block_size 100 + 1)");
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// nanoGPT's shakespeare_char/prepare.py, in Python, on the same text: the
// vocabulary (sorted set of characters), train = data[:int(n*0.9)] and val
// = the rest as uint16 files.
TEST(TextData, EqualsNanoGptsPrepareOnTheSameText) {
  if (std::system("python3 -c 'import array' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  testing::TempDir dir;
  const std::string text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\xC3\xA9t\xC3\xA9 \xE2\x82\xAC "
                           "\xF0\x9F\x98\x80 caf\xC3\xA9!\nAll:\nSpeak, speak.\n";
  write_bytes(dir.path() + "/input.txt", text.data(), text.size());
  const std::string py = dir.path() + "/prepare.py";
  std::ofstream(py) << "import array, json, sys\n"
                       "d = sys.argv[1]\n"
                       "data = open(d + '/input.txt', encoding='utf-8').read()\n"
                       "chars = sorted(list(set(data)))\n"
                       "stoi = {ch: i for i, ch in enumerate(chars)}\n"
                       "n = len(data)\n"
                       "enc = lambda s: [stoi[c] for c in s]\n"
                       "array.array('H', enc(data[:int(n * 0.9)])).tofile(open(d + '/ref_train.bin', 'wb'))\n"
                       "array.array('H', enc(data[int(n * 0.9):])).tofile(open(d + '/ref_val.bin', 'wb'))\n"
                       "json.dump(chars, open(d + '/ref_chars.json', 'w'))\n";
  ASSERT_EQ(std::system(("python3 " + py + " " + dir.path()).c_str()), 0);
  const std::string out = data::prepare_text(dir.path() + "/input.txt", false, dir.path() + "/cache");
  EXPECT_EQ(read_file(out + "/train.bin"), read_file(dir.path() + "/ref_train.bin"));
  EXPECT_EQ(read_file(out + "/val.bin"), read_file(dir.path() + "/ref_val.bin"));
  const data::TokenMeta meta = data::read_token_meta(out);
  const auto want = nlohmann::json::parse(read_file(dir.path() + "/ref_chars.json")).get<std::vector<std::string>>();
  EXPECT_EQ(meta.vocab.itos, want);
  EXPECT_EQ(meta.vocab_size, static_cast<int64_t>(want.size()));
  // Round trip through the vocabulary.
  EXPECT_EQ(meta.vocab.decode(meta.vocab.encode(text)), text);
  EXPECT_EQ(error_of([&] { meta.vocab.encode("Speak, Zed"); }),
            "the character 'Z' is not in the model's vocabulary of " + std::to_string(want.size()) + " characters");
}

TEST(TextData, CacheIsReusedUntilTheTextChangesAndBytesTakeAnyText) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t.txt", cache = dir.path() + "/cache";
  write_bytes(path, "abcabcabd\n", 10);
  const std::string first = data::prepare_text(path, false, cache);
  const auto stamp = std::filesystem::last_write_time(first + "/train.bin");
  EXPECT_EQ(data::prepare_text(path, false, cache), first) << "unchanged text: the same cache entry";
  EXPECT_EQ(std::filesystem::last_write_time(first + "/train.bin"), stamp) << "and not rewritten";
  const std::string whole = read_file(first + "/train.bin");
  std::filesystem::resize_file(first + "/train.bin", 4);  // a damaged entry: made again, whole
  EXPECT_EQ(data::prepare_text(path, false, cache), first);
  EXPECT_EQ(read_file(first + "/train.bin"), whole);
  // A meta.json written over (the token files' sizes right): made again too, not an error when opened.
  const std::string meta = read_file(first + "/meta.json");
  write_bytes(first + "/meta.json", "{\"vocab_si", 10);
  EXPECT_EQ(data::prepare_text(path, false, cache), first);
  EXPECT_EQ(read_file(first + "/meta.json"), meta);
  // Token files written over at their sizes (ids of the vocabulary, another text): meta.json's checksum of
  // them tells, and the entry is made again.
  const std::string zeros(whole.size(), '\0');
  write_bytes(first + "/train.bin", zeros.data(), zeros.size());
  EXPECT_EQ(data::prepare_text(path, false, cache), first);
  EXPECT_EQ(read_file(first + "/train.bin"), whole);
  // A cache that cannot be written names the way to another.
  const std::string blocked = dir.path() + "/blocked";
  write_bytes(blocked, "x", 1);
  const std::string e = error_of([&] { data::prepare_text(path, false, blocked); });
  EXPECT_EQ(e.rfind("cannot create the text cache " + blocked + "/text-char-", 0), 0u) << e;
  EXPECT_NE(e.find("point FANOUT_CACHE_DIR at a writable folder with room"), std::string::npos) << e;
  // A temporary a killed preparation left hours ago goes when the entry is written again; a fresh one stays.
  const std::string old_tmp = first + "/train.bin.tmp.77.5", new_tmp = first + "/val.bin.tmp.78.6";
  write_bytes(old_tmp, "x", 1);
  write_bytes(new_tmp, "x", 1);
  std::filesystem::last_write_time(old_tmp, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  std::filesystem::resize_file(first + "/val.bin", 0);
  EXPECT_EQ(data::prepare_text(path, false, cache), first);
  EXPECT_FALSE(std::filesystem::exists(old_tmp));
  EXPECT_TRUE(std::filesystem::exists(new_tmp));
  std::filesystem::remove(new_tmp);
  write_bytes(path, "abcabcabe\n", 10);
  const std::string second = data::prepare_text(path, false, cache);
  EXPECT_NE(second, first) << "a changed text is prepared again";
  EXPECT_EQ(data::read_token_meta(second).vocab.itos, (std::vector<std::string>{"\n", "a", "b", "c", "e"}));
  // Not UTF-8: text refuses it naming the byte, text-bytes takes it.
  write_bytes(path, "ok\xff\xfe", 4);
  const auto entries = [&] {
    return std::distance(std::filesystem::directory_iterator(cache), std::filesystem::directory_iterator());
  };
  const auto before = entries();
  EXPECT_EQ(error_of([&] { data::prepare_text(path, false, cache); }),
            "text " + path + " is not UTF-8 at byte 2 (text-bytes:FILE reads any bytes)");
  EXPECT_EQ(entries(), before) << "a text that fails leaves no cache entry";
  const std::string bytes = data::prepare_text(path, true, cache);
  const data::TokenMeta m = data::read_token_meta(bytes);
  EXPECT_TRUE(m.vocab.bytes);
  EXPECT_EQ(m.vocab_size, 256);
  EXPECT_EQ(m.vocab.decode(m.vocab.encode("ok\xff\xfe")), "ok\xff\xfe");
  EXPECT_EQ(read_file(bytes + "/train.bin"), std::string("o\0k\0\xff\0", 6));  // int(4 * 0.9) = 3 bytes
  write_bytes(path, "", 0);
  EXPECT_EQ(error_of([&] { data::prepare_text(path, false, cache); }), "text " + path + " is empty");
}

// text:FILE reads UTF-8 as Python's strict decoder does (nanoGPT's prepare.py opens the text with it): an
// overlong form, a surrogate, a code point past U+10FFFF, a missing or bad continuation byte are refused at
// their first byte, by both (python3 checks its side when it is installed).
TEST(TextData, RefusesWhatPythonsDecoderRefuses) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t.txt", cache = dir.path() + "/cache";
  const std::pair<std::string, size_t> bad[] = {
      {"ab\xC1\x81", 2},          // 'A' in two bytes (overlong)
      {"a\xE0\x80\xAF", 1},      // '/' in three (overlong)
      {"\xF0\x82\x82\xAC", 0},  // U+20AC in four (overlong)
      {"x\xED\xA0\x80y", 1},     // U+D800, a surrogate
      {"\xF4\x90\x80\x80", 0},  // U+110000
      {"ok\xE2\x82", 2},          // cut short
      {"ok\xE2\x28\xA1", 2},     // a bad continuation byte
      {"\x80", 0},                 // a continuation byte first
      {"\xC1\xBF", 0},             // U+007F in two bytes: one below the smallest of each length,
      {"\xE0\x9F\xBF", 0},         // U+07FF in three,
      {"\xF0\x8F\xBF\xBF", 0},     // U+FFFF in four,
      {"\xED\xBF\xBF", 0},         // U+DFFF, the last surrogate
  };
  const bool python = std::system("python3 -c 'pass' > /dev/null 2>&1") == 0;
  for (size_t c = 0; c < std::size(bad); ++c) {
    const auto& [text, at] = bad[c];
    write_bytes(path, text.data(), text.size());
    EXPECT_EQ(error_of([&] { data::prepare_text(path, false, cache); }),
              "text " + path + " is not UTF-8 at byte " + std::to_string(at) + " (text-bytes:FILE reads any bytes)");
    if (python)
      EXPECT_EQ(std::system(("python3 -c \"import sys\ntry:\n open(sys.argv[1], encoding='utf-8').read()\n"
                             "except UnicodeDecodeError as e:\n sys.exit(0 if e.start == " + std::to_string(at) +
                             " else 2)\nsys.exit(1)\" " + path).c_str()),
                0)
          << "python3 reads case " << c << " otherwise";
  }
  // The smallest and largest of each length are taken: U+0080, U+0800, U+10000 and U+007F, U+07FF, U+FFFF,
  // U+10FFFF; U+D7FF and U+E000 beside the surrogates.
  const std::string edges = "\x7F\xDF\xBF\xEF\xBF\xBF\xF4\x8F\xBF\xBF\xEE\x80\x80\xC2\x80\xE0\xA0\x80"
                            "\xF0\x90\x80\x80\xED\x9F\xBF";
  write_bytes(path, edges.data(), edges.size());
  const data::TokenMeta m = data::read_token_meta(data::prepare_text(path, false, cache));
  EXPECT_EQ(m.vocab.itos, (std::vector<std::string>{"\x7F", "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80", "\xED\x9F\xBF",
                                                    "\xEE\x80\x80", "\xEF\xBF\xBF", "\xF0\x90\x80\x80",
                                                    "\xF4\x8F\xBF\xBF"}));
  EXPECT_EQ(m.vocab.decode(m.vocab.encode(edges)), edges);
  EXPECT_EQ(error_of([&] { m.vocab.encode("\x7F\xC1\x81"); }), "the prompt is not UTF-8 at byte 1");
}

// Invalid UTF-8 in generated bytes becomes U+FFFD as Python's decode(errors="replace") makes it: the Unicode
// standard's example (Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a, 3 x FFFD, b, FFFD, c, 2 x FFFD, d),
// fed whole and byte by byte; an incomplete sequence waits for its bytes, and is one U+FFFD at the end.
TEST(TextData, Utf8StreamReplacesAsPythonDoes) {
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  const std::string want = "a" + r + r + r + "b" + r + "c" + r + r + "d";
  data::Utf8Stream whole;
  EXPECT_EQ(whole.feed(in) + whole.finish(), want);
  data::Utf8Stream bytewise;
  std::string got;
  for (char c : in) got += bytewise.feed(std::string(1, c));
  EXPECT_EQ(got + bytewise.finish(), want);
  data::Utf8Stream split;  // a 4-byte character over two tokens, an ED surrogate, an overlong E0, a cut tail
  EXPECT_EQ(split.feed("x\xF0\x9F"), "x");
  EXPECT_EQ(split.feed("\x98\x80\xED\xA0\x80\xE0\x80"), "\xF0\x9F\x98\x80" + r + r + r + r + r);
  EXPECT_EQ(split.feed("\xE2\x82"), "");
  EXPECT_EQ(split.finish(), r);
}

TEST(TextData, OpenDataNeedsALanguageModelAndAWindowThatFits) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t.txt";
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox\n";  // 1000 characters: 900 train, 100 validation
  write_bytes(path, text.data(), text.size());
  data::DataOptions o;
  o.cache_dir = dir.path() + "/cache";
  EXPECT_EQ(error_of([&] { data::open_data("text:" + path, o); }),
            "dataset 'text:" + path + "' is token data for a language model: train it with --model gpt:...");
  o.block_size = 64;
  const data::DataSplits s = data::open_data("text:" + path, o);
  EXPECT_TRUE(s.token_data());
  EXPECT_EQ(s.classes, 17);  // distinct characters
  EXPECT_EQ(s.train->size(), 899 / 64);
  EXPECT_EQ(s.test->size(), 99 / 64);
  o.block_size = 128;  // longer than the validation split
  EXPECT_NE(error_of([&] { data::open_data("text:" + path, o); }).find("shorter than one window of 129"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { data::open_data("text:", o); }), "bad dataset 'text:': text needs a file (text:FILE)");
  EXPECT_EQ(error_of([&] { data::open_data("tokens:" + dir.path() + "/none", o); }),
            "token data " + dir.path() + "/none does not exist");
  EXPECT_EQ(error_of([&] { data::open_data("tokens:" + path, o); }), "token data " + path + " is not a directory");
  std::filesystem::create_directory(dir.path() + "/bare");
  EXPECT_EQ(error_of([&] { data::open_data("tokens:" + dir.path() + "/bare", o); }),
            "token data " + dir.path() + "/bare has no meta.json giving vocab_size: give the model's vocab_size");
  // meta.json's vocab_size bounds the ids also under a larger (padded) model vocabulary.
  const std::string meta = dir.path() + "/meta";
  std::filesystem::create_directory(meta);
  std::vector<uint16_t> ids(500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7) % 10);
  ids[3] = 40;
  for (const char* f : {"/train.bin", "/val.bin"}) write_bytes(meta + f, ids.data(), ids.size() * 2);
  std::ofstream(meta + "/meta.json") << R"({"vocab_size": 10})";
  o.block_size = 8;
  o.vocab_size = 64;
  EXPECT_EQ(error_of([&] { data::open_data("tokens:" + meta, o); }),
            "token file " + meta + "/train.bin: token 40 at position 3 is outside the vocabulary [0, 10)");
  ids[3] = 9;
  for (const char* f : {"/train.bin", "/val.bin"}) write_bytes(meta + f, ids.data(), ids.size() * 2);
  const data::DataSplits ok = data::open_data("tokens:" + meta, o);
  EXPECT_EQ(ok.classes, 10);
  EXPECT_EQ(ok.tokens.vocab_size, 64) << "the model's vocabulary, as the checkpoints record it";
}

// bench/pytorch/window_order.py (the PyTorch side-by-side trainer's batches)
// gives the epoch orders shuffled_indices gives: the same windows in the same
// order, for one and two items, and for a seed above 2^63.
TEST(WindowOrder, PythonPortEqualsShuffledIndices) {
  if (std::system("python3 -c 'import argparse' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no python3 on PATH to run bench/pytorch/window_order.py";
  testing::TempDir dir;
  const std::string script = std::string(FANOUT_SOURCE_DIR) + "/bench/pytorch/window_order.py";
  struct Case {
    int64_t n;
    uint64_t seed;
    int64_t epoch;
  };
  for (const Case& c : {Case{1000, 7, 3}, Case{1, 7, 3}, Case{2, 7, 0}, Case{2, 7, 1}, Case{2, 7, 2},
                        Case{300, 0xFEDCBA9876543210ull, 5}, Case{300, UINT64_MAX, 0}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " seed " + std::to_string(c.seed) + " epoch " +
                 std::to_string(c.epoch));
    const std::string out = dir.path() + "/order.txt";
    const std::string cmd = "python3 " + script + " --n " + std::to_string(c.n) + " --seed " + std::to_string(c.seed) +
                            " --epoch " + std::to_string(c.epoch) + " > " + out;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::vector<int64_t> got;
    std::ifstream f(out);
    for (int64_t i; f >> i;) got.push_back(i);
    EXPECT_EQ(got, data::shuffled_indices(c.n, c.seed, c.epoch));
  }
}

}  // namespace
}  // namespace fanout
