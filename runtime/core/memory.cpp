// Allocation entry points and counters.
#include "runtime/core/memory.h"

#include "runtime/core/graph.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/error.h"

namespace fanout {

namespace {
std::atomic<uint64_t> g_host_allocs{0}, g_device_allocs{0}, g_live{0}, g_rewrites{0};
thread_local uint64_t t_device_allocs = 0;
thread_local uint64_t t_frees_in_capture = 0;

// Live and peak bytes per CPU device (index); pinned buffers count on cpu:0.
constexpr int kCpuSlots = 512;
std::atomic<uint64_t> g_cpu_live[kCpuSlots], g_cpu_peak[kCpuSlots];
int cpu_slot(const Device& d) { return d.index < 0 ? 0 : d.index >= kCpuSlots ? kCpuSlots - 1 : d.index; }

void count_in(const Device& d, size_t bytes) {
  g_live += bytes;
  if (!d.is_cpu()) return;
  const int i = cpu_slot(d);
  const uint64_t now = g_cpu_live[i] += bytes;
  uint64_t peak = g_cpu_peak[i].load();
  while (now > peak && !g_cpu_peak[i].compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

size_t cpu_device_peak_bytes(Device d) { return d.is_cpu() ? g_cpu_peak[cpu_slot(d)].load() : 0; }
size_t cpu_device_live_bytes(Device d) { return d.is_cpu() ? g_cpu_live[cpu_slot(d)].load() : 0; }
void reset_cpu_device_peak_bytes(Device d) {
  if (d.is_cpu()) g_cpu_peak[cpu_slot(d)] = g_cpu_live[cpu_slot(d)].load();
}

Storage::~Storage() {
  if (!owned || ptr == nullptr) return;
  if (capture_checked()) ++t_frees_in_capture;
  g_live -= bytes;
  if (device.is_cpu()) g_cpu_live[cpu_slot(device)] -= bytes;
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

namespace {
// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t available_host_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return static_cast<uint64_t>(kb) * 1024;
}
}  // namespace

std::shared_ptr<Storage> allocate(Device d, size_t bytes) {
  forbid_in_capture("an allocation");
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = d;
  const size_t rounded = ((bytes + 63) / 64) * 64;
  if (d.is_cuda()) {
    s->ptr = backend::cuda_alloc(d.index, rounded == 0 ? 64 : rounded);
    ++g_device_allocs;
    ++t_device_allocs;
  } else {
    // A large block the machine cannot hold: refused here, not by the kernel's OOM killer when it is touched.
    if (bytes >= (size_t{1} << 30)) {
      const uint64_t available = available_host_bytes();
      FANOUT_USER_CHECK(available == 0 || bytes <= available)
          << "out of host memory: cannot allocate " << format_bytes(bytes) << " (" << format_bytes(available)
          << " available)";
    }
    s->ptr = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    FANOUT_USER_CHECK(s->ptr != nullptr) << "out of host memory: cannot allocate " << format_bytes(bytes);
    ++g_host_allocs;
  }
  count_in(d, bytes);
  return s;
}

std::shared_ptr<Storage> allocate_pinned(size_t bytes) {
  forbid_in_capture("a pinned allocation");
  auto s = std::make_shared<Storage>();
  s->bytes = bytes;
  s->device = Device::cpu();
  s->pinned = true;
  s->ptr = backend::pinned_alloc(bytes == 0 ? 64 : bytes);
  ++g_host_allocs;
  count_in(s->device, bytes);
  return s;
}

AllocStats alloc_stats() { return {g_host_allocs.load(), g_device_allocs.load(), g_live.load()}; }
uint64_t thread_device_allocs() { return t_device_allocs; }
uint64_t thread_frees_in_capture() { return t_frees_in_capture; }
void note_device_state_rewrite() { ++g_rewrites; }
uint64_t device_state_rewrites() { return g_rewrites.load(); }

}  // namespace fanout
