// Backend entry points for a build without CUDA: every CUDA request fails
// with a message naming what was asked for.
#include <cstdlib>
#include <cstring>

#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/core/graph.h"
#include "runtime/core/memory.h"
#include "runtime/core/stream.h"

namespace fanout {

namespace backend {
[[noreturn]] void no_cuda_device(Device d);
}
int cuda_device_count() { return 0; }
bool cuda_available_in_build() { return false; }
void bind_thread_to(Device d) {
  if (d.is_cuda()) backend::no_cuda_device(d);
}
std::vector<CudaDeviceInfo> cuda_device_info() { return {}; }
bool cuda_can_access_peer(int, int) { return false; }
size_t device_peak_bytes(Device d) {
  if (d.is_cuda()) backend::no_cuda_device(d);
  return cpu_device_peak_bytes(d);
}
void reset_device_peak_bytes(Device d) {
  if (d.is_cuda()) backend::no_cuda_device(d);
  reset_cpu_device_peak_bytes(d);
}

namespace backend {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  FANOUT_FAIL() << what << ": this build of fanout has no CUDA backend";
}
}  // namespace
void no_cuda_device(Device d) { no_cuda(d.str().c_str()); }
void* cuda_alloc(int, size_t) { no_cuda("CUDA allocation"); }
void cuda_free(int, void*) noexcept {}
void* pinned_alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  FANOUT_CHECK(p) << "host allocation of " << bytes << " bytes failed";
  return p;
}
void pinned_free(void* p) noexcept { std::free(p); }
void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t bytes, void*) {
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  no_cuda("device copy");
}
void fill_f32_cuda(int, float*, size_t, float, void*) { no_cuda("CUDA fill"); }
void* stream_create(int) { no_cuda("CUDA stream"); }
void stream_destroy(int, void*) noexcept {}
void stream_sync(int, void*) { no_cuda("CUDA stream"); }
void* event_create(int) { no_cuda("CUDA event"); }
void event_destroy(int, void*) noexcept {}
void event_record(int, void*, void*) { no_cuda("CUDA event"); }
void event_wait(int, void*, void*) { no_cuda("CUDA event"); }
void event_sync(int, void*) { no_cuda("CUDA event"); }
void graph_capture_begin(int, void*) { no_cuda("CUDA graph"); }
void* graph_capture_end(int, void*, std::string*) { no_cuda("CUDA graph"); }
void graph_launch(int, void*, void*) { no_cuda("CUDA graph"); }
void graph_destroy(int, void*) noexcept {}
void* cublas_create(int, void*) { no_cuda("cuBLAS"); }
void cublas_destroy(int, void*) noexcept {}
void* cudnn_create(int, void*) { no_cuda("cuDNN"); }
void cudnn_destroy(int, void*) noexcept {}
}  // namespace backend
}  // namespace fanout
