// An exclusive lock on a file for the life of this object (flock: the kernel
// drops it when the process dies, so a crash never blocks the next holder),
// with the holder's description written into the file for whoever is refused.
#pragma once
#include <string>

namespace fanout {

class FileLock {
 public:
  FileLock() = default;
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // Creates `path` (0644) if need be, locks it and writes `holder` into it.
  // Returns 0 when taken; EWOULDBLOCK when another process holds it (then
  // *held_by, if given, is what that holder wrote, trailing blanks cut);
  // otherwise the errno of the step that failed, which failed_step() names
  // ("open", "lock" or "record"). Releases any lock held.
  int take(const std::string& path, const std::string& holder, std::string* held_by = nullptr);
  void release();
  bool held() const { return fd_ >= 0; }
  const char* failed_step() const { return failed_step_; }

 private:
  int fd_ = -1;
  const char* failed_step_ = "";
};

}  // namespace fanout
