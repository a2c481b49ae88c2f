// UTF-8 read as Python's strict decoder reads it: shared by the character
// vocabulary and the byte-level BPE (tokens.h, bpe.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/core/error.h"

namespace fanout::data {

// The UTF-8 sequence at text[i]: its length and code point, or 0 where it is
// not UTF-8 (a bad or missing continuation byte, an overlong form, a
// surrogate, past U+10FFFF).
inline size_t utf8_next(std::string_view text, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(text[i + k])); };
  const uint32_t c = b(0);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) >> 6) != 0x2) return 0;
  static constexpr uint32_t kLeadBits[] = {0, 0x7f, 0x1f, 0x0f, 0x07}, kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  cp = c & kLeadBits[n];
  for (size_t k = 1; k < n; ++k) cp = cp << 6 | (b(k) & 0x3f);
  const bool ok = cp >= kSmallest[n] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
  return ok ? n : 0;
}

// Calls each(i, n, code point) for the characters of `text`; one-line error at
// the first invalid sequence, naming `what` ("text FILE", "the prompt"), then `hint`.
template <typename Each>
void for_utf8_chars(std::string_view text, const std::string& what, const char* hint, Each&& each) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_next(text, i, cp);
    FANOUT_USER_CHECK(n > 0) << what << " is not UTF-8 at byte " << i << hint;
    each(i, n, cp);
    i += n;
  }
}

// The UTF-8 bytes of code point cp (at most U+10FFFF).
inline std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace fanout::data
