// Error type and check macros. Every failed check throws fanout::Error carrying
// the expression, file, line and (for library calls) the library's message.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace fanout {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// Collects a message with <<; Thrower & stream throws it. This keeps
// `FANOUT_CHECK(c) << msg` a single statement without a throwing destructor.
class ErrorStream {
 public:
  ErrorStream(const char* file, int line, const char* expr) {
    os_ << expr << " failed at " << file << ":" << line;
  }
  template <class T>
  ErrorStream& operator<<(const T& v) {
    if (!has_msg_) { os_ << ": "; has_msg_ = true; }
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }
 private:
  std::ostringstream os_;
  bool has_msg_ = false;
};
struct Thrower {
  [[noreturn]] void operator&(const ErrorStream& s) const { throw Error(s.str()); }
};
// User-facing error: message only, no source location (bad input, not bugs).
class UserErrorStream {
 public:
  template <class T>
  UserErrorStream& operator<<(const T& v) { os_ << v; return *this; }
  std::string str() const { return os_.str(); }
 private:
  std::ostringstream os_;
};
struct UserThrower {
  [[noreturn]] void operator&(const UserErrorStream& s) const { throw Error(s.str()); }
};
}  // namespace detail
}  // namespace fanout

// Internal invariant: message carries expression, file and line.
#define FANOUT_CHECK(cond)                                   \
  if (cond) {                                                \
  } else                                                     \
    ::fanout::detail::Thrower() &                            \
        ::fanout::detail::ErrorStream(__FILE__, __LINE__, "check `" #cond "`")

// Bad input from a user: the message alone, meant to be printed as one line.
#define FANOUT_USER_CHECK(cond) \
  if (cond) {                   \
  } else                        \
    ::fanout::detail::UserThrower() & ::fanout::detail::UserErrorStream()

#define FANOUT_FAIL() \
  ::fanout::detail::UserThrower() & ::fanout::detail::UserErrorStream()
