// The atomic file write (runtime/io/file_io.h).
#include "runtime/io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>

#include "runtime/core/error.h"

namespace fanout::io {

namespace {

using detail::errno_text;
using detail::Fd;

void write_all(int fd, const void* buf, size_t n, const std::string& tmp) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (r < 0 && errno == EINTR) continue;
    FANOUT_USER_CHECK(r > 0) << "writing " << tmp << " failed: " << (r < 0 ? errno_text(errno) : "no progress");
    p += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace

std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  FANOUT_USER_CHECK(fd.fd >= 0) << "cannot open " << what << " " << path << ": " << errno_text(errno);
  struct stat st{};
  FANOUT_USER_CHECK(::fstat(fd.fd, &st) == 0) << "cannot read " << what << " " << path << ": " << errno_text(errno);
  FANOUT_USER_CHECK(!S_ISDIR(st.st_mode)) << what << " " << path << " is a directory, not a file";
  FANOUT_USER_CHECK(S_ISREG(st.st_mode)) << what << " " << path << " is not a regular file";
  FANOUT_USER_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes)
      << what << " " << path << " is " << st.st_size << " bytes, more than the " << max_bytes << " it may hold";
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd.fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    FANOUT_USER_CHECK(r >= 0) << "cannot read " << what << " " << path << ": " << errno_text(errno);
    if (r == 0) break;  // shrank while read
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

void write_file_atomic(const std::string& given, const std::function<void(const WriteFn&)>& produce) {
  // A symbolic link is written through (the link stays; its target is replaced), and an existing
  // file keeps its permissions.
  namespace fs = std::filesystem;
  fs::path target = given;
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(target, ec); ++hops) {  // to the last link's target, existing or not
    FANOUT_USER_CHECK(hops < 40) << "cannot follow the links from " << given << ": too many levels";
    const fs::path next = fs::read_symlink(target, ec);
    FANOUT_USER_CHECK(!ec) << "cannot follow the link " << target.string() << ": " << ec.message();
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const std::string path = target.string();
  struct stat before{};
  const bool existed = ::stat(path.c_str(), &before) == 0 && S_ISREG(before.st_mode);
  // PATH.tmp.PID.N: unique to this write even where two processes share a PID (containers on one disk).
  static std::atomic<uint64_t> writes{0};
  std::string tmp;
  Fd fd(-1);
  for (int attempt = 0; fd.fd < 0; ++attempt) {
    // The clock and a count: no two writes of one process share them, random_device would not add much.
    const uint64_t n = (static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                        (writes.fetch_add(1) << 40)) & 0xffffffffffffull;
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n);
    fd.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    const int err = errno;
    FANOUT_USER_CHECK(fd.fd >= 0 || (err == EEXIST && attempt < 8)) << "cannot create " << tmp << ": "
                                                                       << errno_text(err);
  }
  FANOUT_USER_CHECK(!existed || ::fchmod(fd.fd, before.st_mode & 07777) == 0)
      << "cannot give " << tmp << " the permissions of " << path << ": " << errno_text(errno);
  bool committed = false;
  struct Cleanup {  // removes the temporary file unless it was renamed into place
    Fd& fd;
    const std::string& tmp;
    const bool& committed;
    ~Cleanup() {
      if (fd.fd >= 0) ::close(fd.release());
      if (!committed) ::unlink(tmp.c_str());
    }
  } cleanup{fd, tmp, committed};

  produce([&](const void* data, size_t bytes) { write_all(fd.fd, data, bytes, tmp); });
  FANOUT_USER_CHECK(::fsync(fd.fd) == 0) << "fsync of " << tmp << " failed: " << errno_text(errno);
  FANOUT_USER_CHECK(::close(fd.release()) == 0) << "closing " << tmp << " failed: " << errno_text(errno);
  FANOUT_USER_CHECK(::rename(tmp.c_str(), path.c_str()) == 0)
      << "cannot rename " << tmp << " to " << path << ": " << errno_text(errno);
  committed = true;

  // Make the rename itself durable.
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  FANOUT_USER_CHECK(dfd.fd >= 0) << "saved " << path << " but cannot open its directory to sync it: "
                                 << errno_text(errno);
  if (::fsync(dfd.fd) != 0 && errno != EINVAL && errno != ENOTSUP)  // some filesystems cannot sync directories
    FANOUT_FAIL() << "saved " << path << " but syncing its directory failed: " << errno_text(errno);
}

}  // namespace fanout::io
