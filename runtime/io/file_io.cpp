// The atomic file write (runtime/io/file_io.h).
#include "runtime/io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>

#include "runtime/core/error.h"

namespace fanout::io {

namespace {

using detail::errno_text;
using detail::Fd;

}  // namespace

std::string write_target(const std::string& given) {
  namespace fs = std::filesystem;
  fs::path target = given;
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(target, ec); ++hops) {
    FANOUT_USER_CHECK(hops < 40) << "cannot follow the links from " << given << ": too many levels";
    const fs::path next = fs::read_symlink(target, ec);
    FANOUT_USER_CHECK(!ec) << "cannot follow the link " << target.string() << ": " << ec.message();
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target.string();
}

void create_directories(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec && fs::is_directory(dir, ec)) return;
  std::string why = ec ? ec.message() : "not a directory";
  // "File exists" says nothing of a link on the way that points nowhere: name it and where it points.
  std::error_code link_ec;
  for (fs::path p = dir; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (!fs::is_symlink(p, link_ec)) continue;
    if (fs::exists(p, link_ec) && fs::is_directory(p, link_ec)) break;
    const fs::path to = fs::read_symlink(p, link_ec);
    why = (p == fs::path(dir) ? std::string("it") : p.string()) + " is a link to " + to.string() +
          (fs::exists(p, link_ec) ? ", which is not a directory" : ", which does not exist");
    break;
  }
  FANOUT_FAIL() << "cannot create " << what << " " << dir << ": " << why;
}

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

void write_file_atomic(const std::string& path, const std::function<void(const WriteFn&)>& produce) {
  StagedFiles files;
  files.add(path, produce);
  files.commit();
}

StagedFiles::~StagedFiles() {
  for (const Staged& s : staged_) ::unlink(s.tmp.c_str());
}

void StagedFiles::add(const std::string& given, const std::function<void(const WriteFn&)>& produce) {
  const std::string path = write_target(given);
  struct stat before{};
  const bool existed = ::stat(path.c_str(), &before) == 0 && S_ISREG(before.st_mode);
  // Errors name the file being written, and say that what was there is kept.
  const std::string kept = existed ? " (" + path + " is as it was)" : "";
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
    FANOUT_USER_CHECK(fd.fd >= 0 || (err == EEXIST && attempt < 8))
        << "cannot write " << path << ": cannot create " << tmp << ": " << errno_text(err) << kept;
  }
  bool done = false;
  struct Cleanup {  // removes the temporary file unless it was staged
    Fd& fd;
    const std::string& tmp;
    const bool& done;
    ~Cleanup() {
      if (fd.fd >= 0) ::close(fd.release());
      if (!done) ::unlink(tmp.c_str());
    }
  } cleanup{fd, tmp, done};
  const auto fail = [&](const char* step, int err) {
    FANOUT_FAIL() << "cannot write " << path << ": " << step << errno_text(err) << kept;
  };
  if (existed && ::fchmod(fd.fd, before.st_mode & 07777) != 0) fail("cannot keep its permissions: ", errno);
  produce([&](const void* data, size_t bytes) {
    if (const int err = detail::write_all(fd.fd, data, bytes)) fail("", err);
  });
  if (::fsync(fd.fd) != 0) fail("fsync: ", errno);
  if (::close(fd.release()) != 0) fail("close: ", errno);
  staged_.push_back({path, tmp});
  done = true;
}

void StagedFiles::commit() {
  std::vector<std::string> dirs;
  while (!staged_.empty()) {
    const Staged s = staged_.front();
    if (::rename(s.tmp.c_str(), s.path.c_str()) != 0) {
      const int err = errno;
      FANOUT_FAIL() << "cannot replace " << s.path << ": " << errno_text(err) << " (renaming " << s.tmp << ")";
    }
    staged_.erase(staged_.begin());
    const std::filesystem::path parent = std::filesystem::path(s.path).parent_path();
    const std::string dir = parent.empty() ? std::string(".") : parent.string();
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  // Make the renames themselves durable.
  for (const std::string& dir : dirs) {
    Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    FANOUT_USER_CHECK(dfd.fd >= 0) << "saved into " << dir << " but cannot open it to sync it: " << errno_text(errno);
    if (::fsync(dfd.fd) != 0 && errno != EINVAL && errno != ENOTSUP)  // some filesystems cannot sync directories
      FANOUT_FAIL() << "saved into " << dir << " but syncing it failed: " << errno_text(errno);
  }
}

}  // namespace fanout::io
