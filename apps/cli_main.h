// The exit-status convention of fanout's command-line tools: 0 success,
// 1 bad input (fanout::Error, or host memory exhausted), 2 bad usage (a Boost.Program_options error),
// 3 internal error; each failure is one line on stderr. SIGPIPE is ignored:
// a closed stdout (`dp-train ... | head`) loses the output, not the run.
#pragma once
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <boost/program_options/errors.hpp>
#include <boost/program_options/options_description.hpp>
#include <boost/program_options/parsers.hpp>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/core/tensor.h"
#include "runtime/io/file_io.h"

namespace fanout::apps {

// --betas BETA1,BETA2 (dp-train and dp-bench); the range is the optimizer's to check.
inline std::pair<double, double> parse_betas(const std::string& s) {
  double b1 = 0, b2 = 0;
  char comma = 0;
  std::istringstream in(s);
  in >> b1 >> comma >> b2;
  FANOUT_USER_CHECK(!in.fail() && comma == ',' && (in >> std::ws).eof())
      << "--betas takes BETA1,BETA2 (e.g. 0.9,0.999), got '" << s << "'";
  return {b1, b2};
}

// --seed: an unsigned 64-bit integer written in decimal (a negative one
// would otherwise wrap).
inline uint64_t parse_seed(const std::string& s) {
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, v);
  FANOUT_USER_CHECK(!s.empty() && ec == std::errc() && ptr == end)
      << "--seed must be an integer in 0..18446744073709551615, got '" << s << "'";
  return v;
}

// This program's executable (to start workers of itself, or find its siblings).
inline std::string self_path() {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  FANOUT_USER_CHECK(n > 0) << "cannot find this program's path (/proc/self/exe)";
  return std::string(self, static_cast<size_t>(n));
}

// An output file that long work will write at its end: its folder exists and
// it can be written, checked first so that a typo does not cost the run.
inline void check_output_file(const char* flag, const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  FANOUT_USER_CHECK(!given.empty()) << flag << " needs a file name";
  // What is there (links followed: a file, or a stream such as /dev/stdout) is appended to; what is not
  // is made where the links lead.
  struct stat st{};
  const bool exists = ::stat(given.c_str(), &st) == 0;
  const std::string path = exists ? given : io::write_target(given);
  const std::string shown = path == given ? given : given + " (a link to " + path + ")";
  FANOUT_USER_CHECK(!exists || !S_ISDIR(st.st_mode)) << flag << " " << shown << " is a directory";
  const fs::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  FANOUT_USER_CHECK(exists || fs::is_directory(dir, ec))
      << flag << " " << shown << ": the folder " << dir << " does not exist";
  // Opened as the end will open it (access() says yes to root on /proc and read-only mounts):
  // the file for appending, unchanged; else a new probe file in the folder, removed at once.
  std::string probe = exists ? path : dir + "/.fanout-probe-XXXXXX";
  const int fd = exists ? ::open(probe.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK) : ::mkstemp(probe.data());
  FANOUT_USER_CHECK(fd >= 0) << flag << " " << shown << ": " << (exists ? "the file" : "the folder " + dir)
                             << " is not writable (" << std::strerror(errno) << ")";
  ::close(fd);
  if (!exists) ::unlink(probe.c_str());
}

// --input: "CxHxW" or "CxDxHxW", every size positive, nothing after it.
inline Shape parse_input(const std::string& s) {
  std::vector<int64_t> d;
  std::istringstream is(s);
  for (;;) {
    int64_t v = 0;
    if (!(is >> v) || v <= 0) break;
    d.push_back(v);
    if (is.peek() != 'x') break;
    is.get();
  }
  FANOUT_USER_CHECK(is.eof() && (d.size() == 3 || d.size() == 4))
      << "bad --input '" << s << "' (expected CxHxW or CxDxHxW, e.g. 3x32x32)";
  return d.size() == 3 ? Shape{d[0], d[1], d[2]} : Shape{d[0], d[1], d[2], d[3]};
}

// SIGINT / SIGTERM during a benchmark (dp-bench): recorded and passed on to
// the child in flight (g_child), so that the benchmark stops, reports what it
// finished and exits with 128 + the signal.
inline volatile sig_atomic_t g_interrupted = 0;
inline volatile pid_t g_child = 0;
inline void on_interrupt(int sig) {
  g_interrupted = sig;
  if (g_child > 0) ::kill(g_child, sig);
}

// Catches SIGINT and SIGTERM with on_interrupt while it lives.
class InterruptGuard {
 public:
  InterruptGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// The one line (on stdout, before the table) of a benchmark stopped by `sig`.
inline void print_interrupted(int sig, int finished, int total, const char* what) {
  std::printf("stopped by %s after %d of %d %s: the table and --json hold those\n",
              sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : strsignal(sig), finished, total, what);
  std::fflush(stdout);
}

// The command line by `desc`, refusing words that are no option's (Boost
// would drop them: `--nesterov false` turned Nesterov on and ignored "false").
inline boost::program_options::parsed_options parse_command_line(int argc, char** argv,
                                                                 const boost::program_options::options_description& desc) {
  namespace po = boost::program_options;
  po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).run();
  const std::vector<std::string> stray = po::collect_unrecognized(parsed.options, po::include_positional);
  if (stray.empty()) return parsed;
  std::string after;  // the option before the word, when it takes no value
  for (int i = 2; i < argc; ++i)
    if (stray[0] == argv[i] && std::strncmp(argv[i - 1], "--", 2) == 0) {
      const po::option_description* o = desc.find_nothrow(argv[i - 1] + 2, false);
      if (o && o->semantic()->max_tokens() == 0) after = argv[i - 1];
      break;
    }
  throw po::error("unexpected argument '" + stray[0] + "'" +
                  (after.empty() ? std::string(" (every argument is an option: --NAME VALUE)")
                                 : " (" + after + " is a switch: give it alone to turn it on, leave it out for off)"));
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
  } catch (const std::bad_array_new_length& e) {  // a size gone wrong, not memory exhausted
    std::fprintf(stderr, "%s: internal error: %s\n", name, e.what());
    return 3;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of host memory (a model, batch or data set too large for this machine?)\n",
                 name);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", name, e.what());
    return 3;
  }
}

}  // namespace fanout::apps
