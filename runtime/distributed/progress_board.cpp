#include "runtime/distributed/progress_board.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>

#include "runtime/core/error.h"

namespace fanout::distributed {

namespace {

// One worker's slot. Writers serialize on `lock`; `version` is odd while a
// writer is in the middle, so a reader retries instead of reading half.
struct Slot {
  std::atomic<uint32_t> lock;
  std::atomic<uint32_t> version;
  std::atomic<uint64_t> entered;
  std::atomic<int32_t> inside;
  std::atomic<int32_t> failed;
  std::atomic<int64_t> changed_ns;
  std::atomic<int64_t> elements;
  std::atomic<uint64_t> number;
  char what[80];
};
static_assert(sizeof(Slot) == 128 && std::atomic<uint64_t>::is_always_lock_free);

int64_t now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the machine
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// This worker's slot on the launcher's board, or null.
Slot* my_slot() {
  static Slot* const slot = [] () -> Slot* {
    const char* fd_s = std::getenv("FANOUT_PROGRESS_FD");
    const char* lr_s = std::getenv("LOCAL_RANK");
    if (!fd_s || !lr_s) return nullptr;
    const int fd = std::atoi(fd_s), local = std::atoi(lr_s);
    const off_t end = static_cast<off_t>(local + 1) * static_cast<off_t>(sizeof(Slot));
    if (fd < 0 || local < 0 || ::lseek(fd, 0, SEEK_END) < end) return nullptr;
    // The whole board (an offset must be page-aligned): this process writes its own slot only.
    void* p = ::mmap(nullptr, static_cast<size_t>(end), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? nullptr : static_cast<Slot*>(p) + local;
  }();
  return slot;
}

struct Locked {
  Slot& s;
  explicit Locked(Slot& slot) : s(slot) {
    while (s.lock.exchange(1, std::memory_order_acquire)) {
    }
    s.version.fetch_add(1, std::memory_order_acq_rel);
  }
  ~Locked() {
    s.changed_ns.store(now_ns(), std::memory_order_relaxed);
    s.version.fetch_add(1, std::memory_order_release);
    s.lock.store(0, std::memory_order_release);
  }
};

}  // namespace

CollectiveMark::CollectiveMark(const std::string& what, int64_t elements, uint64_t number)
    : slot_(my_slot()), exceptions_(std::uncaught_exceptions()) {
  if (!slot_) return;
  Slot& s = *static_cast<Slot*>(slot_);
  Locked l(s);
  s.failed.store(0, std::memory_order_relaxed);
  s.entered.fetch_add(1, std::memory_order_relaxed);
  s.inside.fetch_add(1, std::memory_order_relaxed);
  s.elements.store(elements, std::memory_order_relaxed);
  s.number.store(number, std::memory_order_relaxed);
  const size_t n = std::min(what.size(), sizeof s.what - 1);
  std::memcpy(s.what, what.data(), n);
  s.what[n] = '\0';
}

CollectiveMark::~CollectiveMark() {
  if (!slot_) return;
  Slot& s = *static_cast<Slot*>(slot_);
  Locked l(s);
  s.inside.fetch_sub(1, std::memory_order_relaxed);
  if (std::uncaught_exceptions() > exceptions_) s.failed.store(1, std::memory_order_relaxed);
}

ProgressBoard::ProgressBoard(int slots) : slots_(slots) {
  fd_ = ::memfd_create("fanout-progress", 0);  // inherited through exec: the workers open it by number
  FANOUT_CHECK(fd_ >= 0) << "cannot create the workers' progress board: " << std::strerror(errno);
  const size_t bytes = sizeof(Slot) * static_cast<size_t>(slots);
  FANOUT_CHECK(::ftruncate(fd_, static_cast<off_t>(bytes)) == 0) << "cannot size the progress board: " << std::strerror(errno);
  map_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  FANOUT_CHECK(map_ != MAP_FAILED) << "cannot map the progress board: " << std::strerror(errno);
  clear();
}

ProgressBoard::~ProgressBoard() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, sizeof(Slot) * static_cast<size_t>(slots_));
  if (fd_ >= 0) ::close(fd_);
}

void ProgressBoard::clear() {
  std::memset(map_, 0, sizeof(Slot) * static_cast<size_t>(slots_));
  cleared_ns_ = now_ns();
}

ProgressBoard::Seen ProgressBoard::read(int slot) const {
  const Slot& s = static_cast<const Slot*>(map_)[slot];
  Seen out;
  // A writer stopped mid-write (SIGSTOP) leaves `version` odd: take what is there after a few tries.
  for (int tries = 0; tries < 1000; ++tries) {
    const uint32_t v = s.version.load(std::memory_order_acquire);
    out.entered = s.entered.load(std::memory_order_relaxed);
    out.inside = s.inside.load(std::memory_order_relaxed);
    out.failed = s.failed.load(std::memory_order_relaxed) != 0;
    out.elements = s.elements.load(std::memory_order_relaxed);
    out.number = s.number.load(std::memory_order_relaxed);
    const int64_t changed = s.changed_ns.load(std::memory_order_relaxed);
    char what[sizeof s.what];
    std::memcpy(what, s.what, sizeof what);
    what[sizeof what - 1] = '\0';
    out.what = what;
    out.idle_s = static_cast<double>(now_ns() - (changed ? changed : cleared_ns_)) * 1e-9;
    if (v % 2 == 0 && s.version.load(std::memory_order_acquire) == v) break;
  }
  return out;
}

std::string ProgressBoard::describe(int slot, int rank) const {
  const Seen s = read(slot);
  const std::string which = s.what + " (collective #" + std::to_string(s.id()) + ", " + std::to_string(s.elements) +
                            " elements)";
  char buf[320];
  if (s.entered == 0)
    std::snprintf(buf, sizeof buf, "rank %d has begun no collective (%.1f s since it started)", rank, s.idle_s);
  else if (s.failed && s.inside == 0)
    std::snprintf(buf, sizeof buf, "rank %d failed in %s", rank, which.c_str());
  else if (s.inside > 0)
    std::snprintf(buf, sizeof buf, "rank %d is in %s for %.1f s", rank, which.c_str(), s.idle_s);
  else
    std::snprintf(buf, sizeof buf, "rank %d is outside any collective for %.1f s, after %s", rank, s.idle_s,
                  which.c_str());
  return buf;
}

}  // namespace fanout::distributed
