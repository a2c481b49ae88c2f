// Device naming and device-list parsing.
#include "runtime/core/device.h"

#include <sched.h>
#include <sys/resource.h>

#include <cctype>
#include <cstdlib>
#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/core/error.h"

namespace fanout {

size_t peak_host_bytes() {
  rusage u{};
  FANOUT_CHECK(getrusage(RUSAGE_SELF, &u) == 0) << "getrusage failed";
  return static_cast<size_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string Device::str() const {
  return (kind == DeviceKind::CPU ? "cpu:" : "cuda:") + std::to_string(index);
}

int host_cores() {
  // The cores this process may run on (taskset, a container's cpuset, a batch system's binding), as
  // nproc and OpenMP count them; the machine's count only where the mask cannot be read.
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int kernel_thread_budget() {
  const int cores = host_cores();
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return cores;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);  // "4" or "4,2" (OpenMP's nested form: the first level counts)
  if (end == v || n < 1) return cores;
  return static_cast<int>(std::min<long>(n, cores));
}

namespace {
bool parse_int(const std::string& s, int& out) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  out = std::stoi(s);
  return true;
}
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

std::vector<Device> parse_devices(const std::string& spec_in, bool allow_repeat) {
  const std::string spec = trim(spec_in);
  FANOUT_USER_CHECK(!spec.empty()) << "empty device list";
  if (spec == "cpu") return {Device::cpu(0)};
  const bool listed = spec.find(',') != std::string::npos;
  if (spec.rfind("cpu:", 0) == 0 && !listed) {
    int n = 0;
    FANOUT_USER_CHECK(parse_int(spec.substr(4), n) && n >= 1 && n <= 256)
        << "bad CPU device count in '" << spec << "' (expected cpu:N with 1 <= N <= 256: N counts CPU workers"
        << (spec == "cpu:0" ? ", so torch's cpu:0 is cpu here" : "") << ")";
    std::vector<Device> out;
    for (int i = 0; i < n; ++i) out.push_back(Device::cpu(i));
    return out;
  }
  const int count = cuda_device_count();
  if (spec == "auto") {
    // Every visible GPU; without one, one CPU replica per core (dp-train's
    // --devices auto also caps that by the batch: auto_devices in
    // runtime/parallel/engine_factory.h).
    if (count > 0 && cuda_available_in_build()) return parse_devices("all", allow_repeat);
    const int cores = host_cores();
    return parse_devices(cores == 1 ? "cpu" : "cpu:" + std::to_string(std::min(cores, 256)), allow_repeat);
  }
  if (spec == "all") {
    FANOUT_USER_CHECK(cuda_available_in_build())
        << "devices 'all': this build has no CUDA backend (use cpu or cpu:N)";
    FANOUT_USER_CHECK(count > 0) << "devices 'all': no visible CUDA device"
                                 << (std::getenv("CUDA_VISIBLE_DEVICES") ? " (check CUDA_VISIBLE_DEVICES)" : "");
    std::vector<Device> out;
    for (int i = 0; i < count; ++i) out.push_back(Device::cuda(i));
    return out;
  }
  std::vector<Device> out;
  std::set<int> seen;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    FANOUT_USER_CHECK(!item.empty()) << "empty entry in device list '" << spec << "'";
    FANOUT_USER_CHECK(item.rfind("cpu", 0) != 0 || !listed)
        << "device list '" << spec << "': CPU devices are given as cpu or cpu:N alone (N workers), not in a list";
    FANOUT_USER_CHECK(item != "all" && item != "auto")
        << "device list '" << spec << "': " << item << " stands alone, not in a list";
    std::string num = item.rfind("cuda:", 0) == 0 ? item.substr(5) : item;
    int idx = 0;
    FANOUT_USER_CHECK(parse_int(num, idx))
        << "unknown device '" << item << "' (expected cpu, cpu:N, all, N or cuda:N)";
    FANOUT_USER_CHECK(cuda_available_in_build())
        << "device '" << item << "' requested but this build has no CUDA backend";
    FANOUT_USER_CHECK(count > 0) << "device '" << item << "' requested but no CUDA device is visible"
                                 << (std::getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES='" +
                                                                                std::string(std::getenv("CUDA_VISIBLE_DEVICES")) + "')"
                                                                          : "");
    FANOUT_USER_CHECK(idx < count) << "device " << item << " out of range: " << count
                                   << " CUDA device(s) visible";
    FANOUT_USER_CHECK(allow_repeat || seen.insert(idx).second)
        << "device " << item << " is repeated in '" << spec << "'";
    out.push_back(Device::cuda(idx));
  }
  return out;
}

}  // namespace fanout
