#include "runtime/core/file_lock.h"
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <cerrno>

namespace fanout {

FileLock::~FileLock() { release(); }

void FileLock::release() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
  fd_ = -1;
}

int FileLock::take(const std::string& path, const std::string& holder, std::string* held_by) {
  release();
  failed_step_ = "open";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  failed_step_ = "lock";
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK && held_by) {
      std::string text(512, '\0');
      const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
      text.resize(n > 0 ? static_cast<size_t>(n) : 0);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      *held_by = text;
    }
    ::close(fd);
    return err;
  }
  failed_step_ = "record";
  errno = 0;
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const int err = errno ? errno : EIO;
    ::close(fd);
    return err;
  }
  fd_ = fd;
  failed_step_ = "";
  return 0;
}

}  // namespace fanout
