// Allocation entry points and counters.
#include "runtime/core/memory.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/error.h"

namespace fanout {

namespace {
std::atomic<uint64_t> g_host_allocs{0}, g_device_allocs{0}, g_live{0};
}

Storage::~Storage() {
  if (!owned || ptr == nullptr) return;
  g_live -= bytes;
  if (pinned) backend::pinned_free(ptr);
  else if (device.is_cuda()) backend::cuda_free(device.index, ptr);
  else std::free(ptr);
}

std::string format_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::shared_ptr<Storage> allocate(Device d, size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = d;
  const size_t rounded = ((bytes + 63) / 64) * 64;
  if (d.is_cuda()) {
    s->ptr = backend::cuda_alloc(d.index, rounded == 0 ? 64 : rounded);
    ++g_device_allocs;
  } else {
    s->ptr = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    FANOUT_USER_CHECK(s->ptr != nullptr) << "out of host memory: cannot allocate " << format_bytes(bytes);
    ++g_host_allocs;
  }
  g_live += bytes;
  return s;
}

std::shared_ptr<Storage> allocate_pinned(size_t bytes) {
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = Device::cpu();
  s->pinned = true;
  s->ptr = backend::pinned_alloc(bytes == 0 ? 64 : bytes);
  ++g_host_allocs;
  g_live += bytes;
  return s;
}

AllocStats alloc_stats() { return {g_host_allocs.load(), g_device_allocs.load(), g_live.load()}; }

}  // namespace fanout
