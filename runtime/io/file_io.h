// Files written and read by the checkpoint, array and metrics code
// (safetensors.cpp, npy.cpp, the trainer's metrics file): the atomic write,
// and small POSIX helpers: an owned descriptor, exact positioned reads,
// errno text, and file text quoted for one-line messages.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace fanout::io {

// Writes `path` atomically: `produce` emits the bytes through the function
// it is given into PATH.tmp.PID.N (N unique to the write), which is fsynced
// and renamed over `path` (through a symbolic link, to its target; an
// existing file's permissions kept), and the directory is fsynced; on
// failure the temporary file is removed,
// an existing file at `path` is left as it was, and fanout::Error is thrown.
using WriteFn = std::function<void(const void* data, size_t bytes)>;
void write_file_atomic(const std::string& path, const std::function<void(const WriteFn&)>& produce);

// Files that are replaced together (a checkpoint and best.safetensors, an
// export's files): add() writes each into its temporary as
// write_file_atomic does, and only commit() renames them all into place
// (then syncs their directories). A failure in add(), or a StagedFiles
// destroyed before commit(), removes the temporaries and leaves every path
// as it was. The renames are one after another, not one atomic step: a
// crash between two of them leaves the earlier ones in place.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles();
  void add(const std::string& path, const std::function<void(const WriteFn&)>& produce);
  void add(const std::string& path, std::string_view bytes) {
    add(path, [&](const WriteFn& write) { write(bytes.data(), bytes.size()); });
  }
  void commit();

 private:
  struct Staged {
    std::string path, tmp;  // path: the given one's final target (links followed)
  };
  std::vector<Staged> staged_;
};
// The same for bytes already in memory (a JSON text, a list).
inline void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, [&](const WriteFn& write) { write(bytes.data(), bytes.size()); });
}

// The file a write to `path` replaces: the target of a symbolic link (of
// the last link of a chain), existing or not; `path` itself when no link.
// A loop, or a link that cannot be read, is a one-line fanout::Error.
std::string write_target(const std::string& path);

// Creates the directory `dir` and its parents (nothing when it is one); a
// one-line fanout::Error names `what` ("checkpoint directory"), the path and
// the cause, for a link the place it points to.
void create_directories(const std::string& dir, const std::string& what);

// The whole of the regular file `path` (named `what` in errors: "text",
// "token meta file"), in one-line errors (fanout::Error) when it does
// not exist, is a directory or another non-regular file, cannot be read, or
// holds more than max_bytes.
std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes = uint64_t(1) << 40);

}  // namespace fanout::io

namespace fanout::io::detail {

inline std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// Text from a file for a one-line message: quoted, control bytes (and, with
// escape_non_ascii, every byte past 0x7e) escaped as \xNN, cut at 120 bytes.
inline std::string quoted(const std::string& s, bool escape_non_ascii) {
  constexpr size_t kMax = 120;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || (escape_non_ascii && c > 0x7f)) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "'";
}

// Owns a file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(Fd&& o) noexcept : fd(o.release()) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int release() {
    const int f = fd;
    fd = -1;
    return f;
  }
};

// Writes all n bytes (EINTR retried); returns 0, or the errno of the write
// that failed (ENOSPC for one that wrote nothing), `written` the bytes
// written before it.
inline int write_all(int fd, const void* data, size_t n, size_t* written = nullptr) {
  auto* p = static_cast<const char*>(data);
  size_t done = 0;
  int err = 0;
  while (done < n) {
    const ssize_t r = ::write(fd, p + done, std::min<size_t>(n - done, size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      err = r == 0 ? ENOSPC : errno;
      break;
    }
    done += static_cast<size_t>(r);
  }
  if (written) *written = done;
  return err;
}

// Reads exactly n bytes at offset; false on a short read (err = errno, or 0 at end of file).
inline bool pread_all(int fd, void* buf, size_t n, uint64_t offset, int* err) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *err = r < 0 ? errno : 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace fanout::io::detail
