// Device memory: 64-byte aligned host memory for CPU devices, stream-ordered
// pools on CUDA devices, pinned host buffers. Allocation counters let tests
// prove the steady-state step allocates nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/core/device.h"

namespace fanout {

// One allocation; freed when the last Tensor viewing it goes away.
struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  bool owned = true;
  bool pinned = false;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

// Out of memory (host or device) is a one-line fanout::Error saying how much
// was asked for (and, on a GPU, how much is free).
std::shared_ptr<Storage> allocate(Device d, size_t bytes);
// "512 B", "3.2 MiB", "9.3 TiB".
std::string format_bytes(uint64_t bytes);
// Page-locked host memory (plain aligned memory when there is no CUDA).
std::shared_ptr<Storage> allocate_pinned(size_t bytes);

struct AllocStats {
  uint64_t host_allocs = 0;    // CPU-device and pinned allocations
  uint64_t device_allocs = 0;  // CUDA-device allocations
  uint64_t live_bytes = 0;
};
AllocStats alloc_stats();
// CUDA-device allocations made by the calling thread (what a CUDA graph
// captured on this thread may point at: runtime/parallel/step_graph.h).
uint64_t thread_device_allocs();
// Storages the calling thread freed inside a captured (or capture-checked)
// step: a graph may still write them after the pool hands them out again.
uint64_t thread_frees_in_capture();
// A layer that rewrites device state it keeps across steps from the host
// (GPT's position ids, on a shape change) says so: a captured step reading
// the old contents must not be replayed.
void note_device_state_rewrite();
uint64_t device_state_rewrites();
// Bytes fanout's storages hold on one CPU device (cpu:N; pinned buffers
// count on cpu:0) and the most they held at once since the last reset (which
// restarts the mark from the bytes live now); 0 for CUDA devices
// (device_peak_bytes reads their pools).
size_t cpu_device_live_bytes(Device d);
size_t cpu_device_peak_bytes(Device d);
void reset_cpu_device_peak_bytes(Device d);

namespace backend {
// Implemented by the CUDA backend (runtime/cuda/) or by stubs without CUDA.
void* cuda_alloc(int device, size_t bytes);
void cuda_free(int device, void* p) noexcept;
void* pinned_alloc(size_t bytes);
void pinned_free(void* p) noexcept;
// Copy between any two memory spaces; `stream` is a cudaStream_t or null.
void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t bytes, void* stream);
void fill_f32_cuda(int device, float* p, size_t n, float v, void* stream);
}  // namespace backend

}  // namespace fanout
