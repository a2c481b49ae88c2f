// Device identity and device-list parsing (`cpu`, `cpu:4`, `0,1`, `cuda:0`, `all`).
#pragma once
#include <string>
#include <vector>

namespace fanout {

enum class DeviceKind { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;  // CPU: worker index; CUDA: logical index inside CUDA_VISIBLE_DEVICES

  static Device cpu(int i = 0) { return {DeviceKind::CPU, i}; }
  static Device cuda(int i) { return {DeviceKind::CUDA, i}; }
  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  // Same memory space: all CPU devices share host memory.
  bool same_memory(const Device& o) const {
    return kind == o.kind && (kind == DeviceKind::CPU || index == o.index);
  }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

// Number of visible CUDA devices; 0 in a build without CUDA or without a GPU.
int cuda_device_count();
// The cores this process may run on (its CPU affinity mask; at least 1):
// what CPU devices share.
int host_cores();
// The threads the CPU devices' kernels share in all: every core, or fewer
// when OMP_NUM_THREADS says so (read as PyTorch reads it), e.g. for
// processes that share the cores (a threaded kernel slows down badly when
// its threads wait for cores another process holds).
int kernel_thread_budget();
// True when this build carries the CUDA backend.
bool cuda_available_in_build();
// Makes `device` the calling thread's current CUDA device (cudaSetDevice);
// a no-op for CPU devices.
void bind_thread_to(Device device);

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t total_bytes = 0, free_bytes = 0;
  int major = 0, minor = 0;  // compute capability
};
// Every visible CUDA device; empty without CUDA or without a GPU.
std::vector<CudaDeviceInfo> cuda_device_info();
// Whether device a can read and write device b's memory directly.
bool cuda_can_access_peer(int a, int b);

// The most bytes fanout's tensors held at once on a device since the process
// started or the last reset: a GPU's memory pool's high-water mark, a CPU
// device's allocator count (cpu_device_peak_bytes). The process's resident
// memory: peak_host_bytes().
size_t device_peak_bytes(Device device);
void reset_device_peak_bytes(Device device);
// This process's peak resident memory (the kernel's high-water mark).
size_t peak_host_bytes();

// Parses a device list: cpu, cpu:N, all (every visible GPU), auto (every
// visible GPU, else cpu:N with N the host's cores), or CUDA indices (0,1 or
// cuda:0,cuda:1). Throws fanout::Error with a one-line message on bad
// input (unknown form, out-of-range index, mixed CPU and CUDA, no GPU).
// `allow_repeat`: whether a CUDA index may appear more than once (DP allows it).
std::vector<Device> parse_devices(const std::string& spec, bool allow_repeat = true);

}  // namespace fanout
