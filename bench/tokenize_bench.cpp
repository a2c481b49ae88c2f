// tokenize-bench DIR FILE [ROUNDS]: loads the byte-level BPE in DIR
// (runtime/data/bpe.h) and encodes FILE with it, as text:FILE's token files
// are made (no special tokens), on one thread; prints the load's seconds and
// the best of ROUNDS (3) encodings, with the token count.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/core/error.h"
#include "runtime/data/bpe.h"
#include "runtime/io/file_io.h"

using namespace fanout;

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: tokenize-bench TOKENIZER_DIR TEXT_FILE [ROUNDS]\n");
    return 2;
  }
  try {
    const auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    const auto t0 = std::chrono::steady_clock::now();
    const auto bpe = data::Bpe::load(argv[1]);
    const double load = seconds(t0, std::chrono::steady_clock::now());
    const std::string text = io::read_file(argv[2], "text");
    char* end = nullptr;
    const long rounds = argc == 4 ? std::strtol(argv[3], &end, 10) : 3;
    FANOUT_USER_CHECK(argc != 4 || (*argv[3] && *end == 0 && rounds >= 1 && rounds <= 1000))
        << "ROUNDS must be an integer in 1..1000, got '" << argv[3] << "'";
    double best = 1e30;
    size_t tokens = 0;
    for (long r = 0; r < rounds; ++r) {
      const auto a = std::chrono::steady_clock::now();
      tokens = bpe->encode(text, false, "text").size();
      best = std::min(best, seconds(a, std::chrono::steady_clock::now()));
    }
    std::printf("load %.3f s, encode %.3f s (best of %ld), %zu tokens, %zu bytes\n", load, best, rounds, tokens,
                text.size());
  } catch (const Error& e) {
    std::fprintf(stderr, "tokenize-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
