// Byte-level BPE (runtime/data/bpe.h): against test/data/bpe_reference.py
// (GPT-2's pattern through Python's re, its bpe() merge loop) on a tokenizer
// that script trains, by hand on a small one, and the files' errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/bpe.h"
#include "runtime/data/open_data.h"
#include "runtime/data/tokens.h"
#include "runtime/data/utf8.h"
#include "runtime/io/file_io.h"
#include "support/dist_util.h"
#include "support/test_util.h"

namespace fanout {
namespace {

using data::Bpe;
using testing::error_of;

void write_text(const std::string& path, const std::string& s) { std::ofstream(path, std::ios::binary) << s; }

std::vector<int32_t> as_ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

std::vector<int32_t> read_ids(const std::string& path) {
  const std::string b = io::read_file(path, "token file");
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < b.size(); i += 2)
    ids.push_back(static_cast<unsigned char>(b[i]) | static_cast<unsigned char>(b[i + 1]) << 8);
  return ids;
}

// Contractions, runs of spaces before words and at the end, tabs, CRLF,
// letters and numbers of other scripts (Cyrillic, CJK, Arabic-Indic digits,
// Roman numerals, fractions), symbols, emoji, no-break and ideographic
// spaces, an information separator (not whitespace to Unicode), and the
// special token's text.
const std::string kText =
    "Hello world, it's 2026!  \n\n  ok. Don't we'll they're I'M ''s 'sam\t\ttabs\r\nand   three spaces x\xC2\xA0y "
    "\xE3\x80\x80z \x1C q \xD9\xA1\xD9\xA2\xD9\xA3 \xE2\x85\xAB \xC2\xBD 3.14 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
    "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD0\xBC\xD0\xB8\xD1\x80 \xF0\x9F\x98\x80\xF0\x9F\x98\x80 !!! "
    "caf\xC3\xA9 na\xC3\xAFve a<|endoftext|>b <|endoftext|> the   the\n\n   world\t hello end   ";

const std::string kTraining =
    "the quick brown fox jumps over the lazy dog. The dog's owner wasn't there; they'll be back at 10:30.\n"
    "Hello hello HELLO world worlds! It's 2026, isn't it? We're here and they've gone.\n"
    "caf\xC3\xA9 caf\xC3\xA9 na\xC3\xAFve \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
    "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xE6\x97\xA5\xE6\x9C\xAC \xE6\x97\xA5\xE6\x9C\xAC 123 123 1234\n";

bool have_python() { return std::system("python3 -c 'import unicodedata' > /dev/null 2>&1") == 0; }

struct Reference {
  testing::TempDir dir;
  nlohmann::json ids;
  Reference(const std::string& text, int merges) {
    const std::string script = std::string(FANOUT_SOURCE_DIR) + "/test/data/bpe_reference.py";
    write_text(dir.path() + "/training.txt", kTraining);
    write_text(dir.path() + "/text.txt", text);
    const std::string d = dir.path();
    EXPECT_EQ(std::system(("python3 " + script + " train " + d + "/training.txt " + d + " " + std::to_string(merges)).c_str()), 0);
    EXPECT_EQ(std::system(("python3 " + script + " encode " + d + " " + d + "/text.txt " + d + "/ids.json").c_str()), 0);
    ids = nlohmann::json::parse(io::read_file(d + "/ids.json", "reference ids"));
  }
};

TEST(Bpe, EncodesAsGpt2sPatternAndMergesDo) {
  if (!have_python()) GTEST_SKIP() << "no python3 to run test/data/bpe_reference.py";
  Reference ref(kText, 300);
  const auto bpe = Bpe::load(ref.dir.path());
  EXPECT_GT(bpe->merges().size(), 100u) << "until the training text had no pair left";
  EXPECT_EQ(bpe->size(), static_cast<int64_t>(256 + bpe->merges().size() + 1)) << "each merge a new token";
  EXPECT_EQ(bpe->specials(), (std::vector<int32_t>{static_cast<int32_t>(bpe->size() - 1)}));
  const std::vector<int32_t> ordinary = bpe->encode(kText, false, "text"), special = bpe->encode(kText, true, "text");
  EXPECT_EQ(ordinary, as_ids(ref.ids["ordinary"]));
  EXPECT_EQ(special, as_ids(ref.ids["special"]));
  EXPECT_LT(ordinary.size(), kText.size()) << "merges applied";
  const data::Vocabulary v = data::bpe_vocabulary(bpe);
  EXPECT_EQ(v.decode(ordinary), kText);
  EXPECT_EQ(v.decode(special), kText);
  EXPECT_EQ(v.encode(kText), special) << "a prompt may name the special token";
  // Random UTF-8 of every length of sequence round-trips and matches the reference.
  std::mt19937 rng(11);
  std::string random_text;
  const uint32_t starts[] = {0x20, 0xA0, 0x400, 0x3040, 0x4E00, 0x1F600, 0x660, 0x2160, 0x9, 0x27, 0x61, 0x61};
  for (int i = 0; i < 4000; ++i) {
    const uint32_t cp = starts[rng() % 12] + rng() % 40;
    random_text += data::utf8_encode(cp);
  }
  Reference random_ref(random_text, 300);
  const auto random_ids = bpe->encode(random_text, false, "text");
  EXPECT_EQ(random_ids, as_ids(random_ref.ids["ordinary"]));
  EXPECT_EQ(v.decode(random_ids), random_text);
}

TEST(Bpe, TextFilesAreCutAndEncodedAsNanoGptsPrepare) {
  if (!have_python()) GTEST_SKIP() << "no python3 to run test/data/bpe_reference.py";
  std::string text;
  for (int i = 0; i < 20; ++i) text += kText + "\n";
  Reference ref(text, 200);
  const auto bpe = Bpe::load(ref.dir.path());
  const std::string cache = ref.dir.path() + "/cache", path = ref.dir.path() + "/text.txt";
  const std::string out = data::prepare_text(path, false, cache, bpe);
  EXPECT_EQ(read_ids(out + "/train.bin"), as_ids(ref.ids["train"]));
  EXPECT_EQ(read_ids(out + "/val.bin"), as_ids(ref.ids["val"]));
  const data::TokenMeta meta = data::read_token_meta(out);
  ASSERT_TRUE(meta.vocab.bpe);
  EXPECT_EQ(meta.vocab.bpe->tokens(), bpe->tokens());
  EXPECT_EQ(meta.vocab.bpe->merges(), bpe->merges());
  EXPECT_EQ(meta.vocab_size, bpe->size());
  EXPECT_EQ(meta.vocab.encode(kText), bpe->encode(kText, true, "text")) << "meta.json's tokenizer encodes as the files'";
  // Reused while unchanged, made again when damaged, another entry for another tokenizer.
  const auto stamp = std::filesystem::last_write_time(out + "/train.bin");
  EXPECT_EQ(data::prepare_text(path, false, cache, bpe), out);
  EXPECT_EQ(std::filesystem::last_write_time(out + "/train.bin"), stamp);
  std::filesystem::resize_file(out + "/val.bin", 2);
  EXPECT_EQ(data::prepare_text(path, false, cache, bpe), out);
  EXPECT_EQ(read_ids(out + "/val.bin"), as_ids(ref.ids["val"]));
  EXPECT_NE(data::prepare_text(path, false, cache), out) << "characters: another entry";
  // Through open_data: the tokenizer as dp-train's --tokenizer gives it.
  data::DataOptions o;
  o.block_size = 8;
  o.cache_dir = cache;
  o.tokenizer = ref.dir.path();
  const data::DataSplits s = data::open_data("text:" + path, o);
  EXPECT_EQ(s.classes, bpe->size());
  ASSERT_TRUE(s.tokens.vocab.bpe);
  // Token files without meta.json take the tokenizer as their vocabulary; one with its own refuses it.
  const std::string files = ref.dir.path() + "/files";
  std::filesystem::create_directories(files);
  std::filesystem::copy_file(out + "/train.bin", files + "/train.bin");
  std::filesystem::copy_file(out + "/val.bin", files + "/val.bin");
  const data::DataSplits t = data::open_data("tokens:" + files, o);
  EXPECT_EQ(t.classes, bpe->size());
  ASSERT_TRUE(t.tokens.vocab.bpe);
  EXPECT_EQ(t.tokens.vocab.bpe->tokens(), bpe->tokens());
  EXPECT_EQ(error_of([&] { data::open_data("tokens:" + out, o); }),
            "token data " + out + " has its own vocabulary (meta.json): give no --tokenizer");
  EXPECT_EQ(error_of([&] { data::open_data("text-bytes:" + path, o); }),
            "--tokenizer encodes text:FILE or names the vocabulary of tokens:DIR, not data text-bytes:" + path);
  o.vocab_size = 100;
  EXPECT_EQ(error_of([&] { data::open_data("text:" + path, o); }),
            "the model's vocab_size 100 is smaller than tokenizer " + ref.dir.path() + "'s " +
                std::to_string(bpe->size()) + " tokens");
}

// GPT-2's spelling of the 256 bytes: printable ones as themselves, the rest from U+0100 on.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> tokens;
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    tokens.push_back(data::utf8_encode(printable ? b : next++));
  }
  return tokens;
}

// A tokenizer small enough to check by hand: the merges' order decides, not
// the pieces' length, and merges never cross the pattern's pieces.
TEST(Bpe, MergesApplyLowestRankFirstWithinPieces) {
  std::vector<std::string> tokens = byte_tokens();
  const std::string space = "\xC4\xA0";  // U+0120 spells the byte 0x20
  EXPECT_EQ(tokens[' '], space);
  for (const std::string& t : std::vector<std::string>{"lo", "ll", space + "l", space + "ll", "he", "hell", "hello"})
    tokens.push_back(t);
  tokens.push_back("<|endoftext|>");
  const std::vector<std::string> merges = {"l o", "l l", space + " l", "h e", space + "l l", "he ll", "hell o"};
  const auto bpe = Bpe::from_lists(tokens, merges, "test");
  const auto id = [&](const std::string& t) {
    return static_cast<int32_t>(std::find(tokens.begin(), tokens.end(), t) - tokens.begin());
  };
  using Ids = std::vector<int32_t>;
  // "llo": (l,o) ranks 0, before (l,l) at 1; no merge joins l and lo.
  EXPECT_EQ(bpe->encode("llo", false, "t"), (Ids{id("l"), id("lo")}));
  // "hello": (l,o) first, then (h,e): he l lo, though "hello" is a token.
  EXPECT_EQ(bpe->encode("hello", false, "t"), (Ids{id("he"), id("l"), id("lo")}));
  // "hell": (l,l), then (h,e), then (he,ll).
  EXPECT_EQ(bpe->encode("hell", false, "t"), (Ids{id("hell")}));
  // " ll" is one piece (the space goes with the letters): (l,l) ranks before (Ġ,l); no merge (Ġ,ll).
  EXPECT_EQ(bpe->encode(" ll", false, "t"), (Ids{id(space), id("ll")}));
  // " lll": every (l,l), left to right, in one step.
  EXPECT_EQ(bpe->encode(" lll", false, "t"), (Ids{id(space), id("ll"), id("l")}));
  // "l l": two pieces, "l" and " l"; "hell." two, the period its own.
  EXPECT_EQ(bpe->encode("l l", false, "t"), (Ids{id("l"), id(space + "l")}));
  EXPECT_EQ(bpe->encode("hell.", false, "t"), (Ids{id("hell"), id(".")}));
  // Two spaces before a word: the first alone, the second with the word; at the end, together.
  EXPECT_EQ(bpe->encode("  ll  ", false, "t"), (Ids{id(space), id(space), id("ll"), id(space), id(space)}));
  EXPECT_EQ(bpe->encode("\n  l", false, "t"), (Ids{id(tokens['\n']), id(space), id(space + "l")}));
  EXPECT_EQ(bpe->specials(), (Ids{id("<|endoftext|>")}));
  EXPECT_EQ(bpe->encode("l<|endoftext|>", true, "t"), (Ids{id("l"), id("<|endoftext|>")}));
  EXPECT_EQ(bpe->encode("l<|endoftext|>", false, "t").size(), 1u + 2u + 9u + 2u) << "l, <|, endoftext, |>, by bytes";
  EXPECT_EQ(error_of([&] { bpe->encode("ok\xff", false, "the prompt"); }), "the prompt is not UTF-8 at byte 2");
  // A token no merge makes that is part of a character (E2 80 of the em dash E2 80 94) is no special token:
  // the dash encodes by its bytes, special tokens allowed or not.
  std::vector<std::string> partial = tokens;
  partial.push_back(tokens[0xE2] + tokens[0x80]);
  const auto with_partial = Bpe::from_lists(partial, merges, "test");
  EXPECT_EQ(with_partial->specials(), (Ids{id("<|endoftext|>")}));
  EXPECT_EQ(with_partial->encode("a\xE2\x80\x94<|endoftext|>", true, "t"),
            (Ids{id("a"), id(tokens[0xE2]), id(tokens[0x80]), id(tokens[0x94]), id("<|endoftext|>")}));
}

// The pattern's classes are Unicode 16.0's, as tiktoken 0.14's: letters and
// digits assigned in 15.0 and 16.0 (Unicode's data files: CJK Extension H,
// Nag Mundari, Kawi, Todhri, outlined digits) join a run of letters or of
// digits; a letter assigned in 17.0 (Sidetic) is neither, and stands alone.
// A merge chain makes each probe one token: one id iff one piece.
TEST(Bpe, ClassesCharactersByUnicode16AsTiktokenDoes) {
  std::vector<std::string> tokens = byte_tokens();
  std::vector<std::string> merges;
  const auto chain = [&](const std::string& s) {  // s's bytes merged left to right into one token
    std::string made = tokens[static_cast<unsigned char>(s[0])];
    for (size_t i = 1; i < s.size(); ++i) {
      const std::string next = tokens[static_cast<unsigned char>(s[i])];
      if (std::find(tokens.begin(), tokens.end(), made + next) == tokens.end()) {  // prefixes are shared
        merges.push_back(made + " " + next);
        tokens.push_back(made + next);
      }
      made += next;
    }
  };
  struct Probe {
    uint32_t cp;
    bool letter, digit;
  };
  const Probe probes[] = {{0xE9, true, false},     {0x663, false, true},    {0x31350, true, false},
                          {0x1E4D0, true, false},  {0x1E4F0, false, true},  {0x11F04, true, false},
                          {0x11F50, false, true},  {0x105C0, true, false},  {0x1CCF0, false, true},
                          {0x10940, false, false}, {0x2603, false, false}};
  for (const Probe& p : probes) {
    chain("a" + data::utf8_encode(p.cp));
    chain("1" + data::utf8_encode(p.cp));
  }
  const auto bpe = Bpe::from_lists(tokens, merges, "test");
  for (const Probe& p : probes) {
    SCOPED_TRACE("U+" + std::to_string(p.cp));
    EXPECT_EQ(bpe->encode("a" + data::utf8_encode(p.cp), false, "t").size() == 1, p.letter);
    EXPECT_EQ(bpe->encode("1" + data::utf8_encode(p.cp), false, "t").size() == 1, p.digit);
  }
}

// save() writes Hugging Face's files: vocab.json the tokens by id (as the
// JSON text spells them), merges.txt a version line then the merges by rank;
// load() reads them back as the same tokenizer. bytes_only() is the 256
// bytes by value, no merges: ids are the text's bytes.
TEST(Bpe, SavedFilesAreHuggingFacesAndLoadBack) {
  std::vector<std::string> tokens = byte_tokens();
  const std::string space = "\xC4\xA0";
  for (const std::string& t : std::vector<std::string>{"he", space + "w", "ll", "hell", "<|endoftext|>"}) tokens.push_back(t);
  const std::vector<std::string> merges = {"h e", space + " w", "l l", "he ll"};
  const auto bpe = Bpe::from_lists(tokens, merges, "test");
  testing::TempDir dir;
  bpe->save(dir.path() + "/hf");
  const nlohmann::ordered_json vocab = nlohmann::ordered_json::parse(io::read_file(dir.path() + "/hf/vocab.json", "v"));
  ASSERT_EQ(vocab.size(), tokens.size());
  size_t i = 0;
  for (const auto& [token, id] : vocab.items()) {
    EXPECT_EQ(token, tokens[i]) << "entry " << i;
    EXPECT_EQ(id.get<size_t>(), i++);
  }
  EXPECT_EQ(io::read_file(dir.path() + "/hf/merges.txt", "m"),
            "#version: 0.2\nh e\n" + space + " w\nl l\nhe ll\n");
  const auto back = Bpe::load(dir.path() + "/hf");
  EXPECT_EQ(back->tokens(), tokens);
  EXPECT_EQ(back->merges(), merges);
  const std::string text = "hello world, hell<|endoftext|> wow\n";
  EXPECT_EQ(back->encode(text, true, "t"), bpe->encode(text, true, "t"));
  EXPECT_EQ(back->specials(), bpe->specials());

  const auto bytes = Bpe::bytes_only();
  EXPECT_EQ(bytes->tokens(), byte_tokens());
  EXPECT_TRUE(bytes->merges().empty());
  std::mt19937 rng(5);
  std::string random_text;
  for (int k = 0; k < 300; ++k) random_text += data::utf8_encode(static_cast<uint32_t>(rng() % 0x3000 + 1));
  std::vector<int32_t> want;
  for (unsigned char c : random_text) want.push_back(c);
  EXPECT_EQ(bytes->encode(random_text, false, "t"), want);
  EXPECT_EQ(error_of([&] { bpe->save("/proc/none/hf"); }).rfind("cannot create tokenizer folder /proc/none/hf: ", 0), 0u);
}

TEST(Bpe, BadFilesAreOneLineErrorsNamingThem) {
  testing::TempDir dir;
  const std::string d = dir.path();
  EXPECT_EQ(error_of([&] { Bpe::load(d + "/none"); }), "tokenizer " + d + "/none does not exist");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }),
            "tokenizer " + d + " has neither vocab.json and merges.txt (Hugging Face's names) nor encoder.json and "
            "vocab.bpe (OpenAI's) of a byte-level BPE such as GPT-2's");
  const std::vector<std::string> bytes = byte_tokens();
  const auto write = [&](std::vector<std::string> tokens, const std::string& merges) {
    nlohmann::json v = nlohmann::json::object();
    for (size_t i = 0; i < tokens.size(); ++i) v[tokens[i]] = i;
    write_text(d + "/encoder.json", v.dump());  // OpenAI's names
    write_text(d + "/vocab.bpe", "#version: 0.2\n" + merges);
  };
  std::vector<std::string> good = bytes;
  good.push_back("ab");
  write(good, "a b\n");
  EXPECT_EQ(Bpe::load(d)->encode("ab", false, "t"), (std::vector<int32_t>{256}));
  const std::string what = "tokenizer " + d;
  write_text(d + "/encoder.json", "[1, 2]");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }),
            d + "/encoder.json is not a tokenizer vocabulary (a JSON object of token: id)");
  write_text(d + "/encoder.json", R"({"a": 0, "b": 0})");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }), d + "/encoder.json: the ids are not 0..1 each used once (token 'b' has 0)");
  std::vector<std::string> no_z(bytes.begin(), bytes.end());
  no_z.erase(no_z.begin() + 'z');
  write(no_z, "");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }), what + ": byte 122 has no token");
  std::vector<std::string> spaced = good;
  spaced.push_back("a b");
  write(spaced, "");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }),
            what + ": token 257 'a b' is not spelled in the byte-level alphabet (U+20)");
  write(good, "a b\nab\n");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }), what + ": merge 2 'ab' is not two tokens separated by a space");
  write(good, "a b\nb a\n");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }),
            what + ": merge 2 'b a' names a token, or makes one, that is not in the vocabulary");
  write(good, "a b\na b\n");
  EXPECT_EQ(error_of([&] { Bpe::load(d); }), what + ": merge 2 'a b' is listed twice");
}

}  // namespace
}  // namespace fanout
