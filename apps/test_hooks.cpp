// Reads apps/test_hooks.h's variables, when the build has FANOUT_TEST_HOOKS.
#include "apps/test_hooks.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <system_error>

#include "runtime/core/error.h"

namespace fanout::apps {
namespace {

#ifdef FANOUT_TEST_HOOKS
// The whole of `s` as a T, or a one-line error naming the variable.
template <typename T>
T parse_whole(const char* name, const std::string& s) {
  T v{};
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  FANOUT_USER_CHECK(!s.empty() && ec == std::errc() && p == end) << name << "='" << s << "' is not a valid value";
  return v;
}

template <typename T>
T read(const char* name, T fallback) {
  const char* v = std::getenv(name);
  return v ? parse_whole<T>(name, v) : fallback;
}

TestHooks read_hooks() {
  TestHooks h;
  const int ignore = read<int>("FANOUT_TEST_IGNORE_STOP", 0);
  FANOUT_USER_CHECK(ignore == 0 || ignore == 1) << "FANOUT_TEST_IGNORE_STOP must be 0 or 1, not " << ignore;
  h.ignore_stop = ignore == 1;
  h.stop_grace_s = read<double>("FANOUT_TEST_STOP_GRACE_S", 0.0);
  h.step_sleep_s = read<double>("FANOUT_TEST_STEP_SLEEP_S", 0.0);
  h.hang_rank = read<int>("FANOUT_TEST_HANG_RANK", -1);
  h.hang_at_step = read<int64_t>("FANOUT_TEST_HANG_AT_STEP", 0);
  FANOUT_USER_CHECK(h.stop_grace_s >= 0 && h.step_sleep_s >= 0 && h.hang_at_step >= 0 && h.hang_rank >= -1)
      << "FANOUT_TEST_* values must not be negative";
  if (const char* v = std::getenv("FANOUT_TEST_SKIP_COLLECTIVE")) {
    const std::string s = v;
    const auto a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
    FANOUT_USER_CHECK(b != std::string::npos) << "FANOUT_TEST_SKIP_COLLECTIVE='" << s << "' is not RANK:TAG:N";
    const char* name = "FANOUT_TEST_SKIP_COLLECTIVE";
    h.skip.rank = parse_whole<int>(name, s.substr(0, a));
    h.skip.tag = parse_whole<uint32_t>(name, s.substr(a + 1, b - a - 1));
    h.skip.n = parse_whole<uint32_t>(name, s.substr(b + 1));
  }
  return h;
}
#else
TestHooks read_hooks() { return {}; }
#endif

}  // namespace

const TestHooks& test_hooks() {
  static const TestHooks hooks = read_hooks();
  return hooks;
}

}  // namespace fanout::apps
