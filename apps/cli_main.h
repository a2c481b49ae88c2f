// The exit-status convention of fanout's command-line tools: 0 success,
// 1 bad input (fanout::Error), 2 bad usage (a Boost.Program_options error),
// 3 internal error; each failure is one line on stderr. SIGPIPE is ignored:
// a closed stdout (`dp-train ... | head`) loses the output, not the run.
#pragma once
#include <signal.h>
#include <unistd.h>

#include <boost/program_options/errors.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "runtime/core/error.h"

namespace fanout::apps {

// This program's executable (to start workers of itself, or find its siblings).
inline std::string self_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  FANOUT_USER_CHECK(n > 0) << "cannot find this program's path (/proc/self/exe)";
  return std::string(self, static_cast<size_t>(n));
}

template <class Run>
int cli_main(const char* name, Run&& run) {
  ::signal(SIGPIPE, SIG_IGN);
  try {
    return run();
  } catch (const boost::program_options::error& e) {
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", name, e.what(), name);
    return 2;
  } catch (const fanout::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name, e.what());
    return 3;
  }
}

}  // namespace fanout::apps
