// CUDA backend of the core runtime: device count, stream-ordered memory pools
// (one per device, high release threshold so the pool keeps what it has;
// frees ordered on the GPU after every stream's queued work), pinned host
// memory, streams, events, cuBLAS and cuDNN handles, copies.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/graph.h"
#include "runtime/core/memory.h"
#include "runtime/core/stream.h"
#include "runtime/cuda/cuda_check.h"

namespace fanout {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}
bool cuda_available_in_build() { return true; }
void bind_thread_to(Device d) {
  if (d.is_cuda()) FANOUT_CUDA_CHECK(cudaSetDevice(d.index));
}

std::vector<CudaDeviceInfo> cuda_device_info() {
  std::vector<CudaDeviceInfo> out;
  const int n = cuda_device_count();
  if (n == 0) return out;  // no driver or no device: nothing to ask the runtime
  int prev = 0;
  FANOUT_CUDA_CHECK(cudaGetDevice(&prev));
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    FANOUT_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    CudaDeviceInfo info;
    info.index = d;
    info.name = p.name;
    info.major = p.major;
    info.minor = p.minor;
    FANOUT_CUDA_CHECK(cudaSetDevice(d));
    FANOUT_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
    out.push_back(info);
  }
  FANOUT_CUDA_CHECK(cudaSetDevice(prev));
  return out;
}

size_t device_peak_bytes(Device d) {
  if (d.is_cpu()) return cpu_device_peak_bytes(d);
  cudaMemPool_t pool;
  FANOUT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d.index));
  uint64_t high = 0;
  FANOUT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  return static_cast<size_t>(high);
}

void reset_device_peak_bytes(Device d) {
  if (d.is_cpu()) return reset_cpu_device_peak_bytes(d);
  cudaMemPool_t pool;
  FANOUT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d.index));
  uint64_t zero = 0;  // the only value the attribute accepts: restarts the mark from the current use
  FANOUT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
}

bool cuda_can_access_peer(int a, int b) {
  if (a == b) return true;
  int ok = 0;
  FANOUT_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
  return ok != 0;
}

namespace detail {
const char* cublas_status_name(cublasStatus_t s) { return cublasGetStatusString(s); }
std::shared_mutex& capture_guard() {
  static std::shared_mutex m;
  return m;
}
bool& capture_guard_owner() {
  thread_local bool owner = false;
  return owner;
}
}  // namespace detail

namespace backend {
namespace {
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(int d) {
    FANOUT_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != d) FANOUT_CUDA_CHECK(cudaSetDevice(d));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
};

std::once_flag g_pool_once;
void configure_pools() {
  std::call_once(g_pool_once, [] {
    const int n = cuda_device_count();
    for (int d = 0; d < n; ++d) {
      cudaMemPool_t pool;
      FANOUT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
      uint64_t threshold = UINT64_MAX;  // never hand memory back to the driver
      FANOUT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
      // A block is handed out again only once its free has completed on the
      // GPU: allocations happen on the legacy stream but are used on any
      // stream, so a reuse ordered only on the allocating stream would race.
      int off = 0;
      FANOUT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &off));
      FANOUT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &off));
    }
  });
}

// Every live stream per device, with an event of its own: a free waits for
// all of them on the GPU instead of synchronizing the device.
struct StreamRegistry {
  std::mutex mu;
  std::map<int, std::map<cudaStream_t, cudaEvent_t>> live;  // device -> stream -> event
  std::map<int, cudaStream_t> free_stream;                  // device -> stream the frees run on
};
StreamRegistry& streams() {
  static StreamRegistry* r = new StreamRegistry;  // never destroyed: frees may run during static teardown
  return *r;
}
// FANOUT_CUDA_ALLOC=plain: cudaMalloc and cudaFree (which waits for the
// device) instead of the stream-ordered pool, so that compute-sanitizer sees
// each tensor as its own allocation. For diagnosis; slow.
bool plain_alloc() {
  static const bool plain = [] {
    const char* v = std::getenv("FANOUT_CUDA_ALLOC");
    return v && std::string(v) == "plain";
  }();
  return plain;
}
}  // namespace

// A step capture holds capture_guard exclusively from begin to end, on the
// capturing thread (a thread-local hold: begin and end come from one thread).
// Frees that thread asks for meanwhile wait until the capture ends: a free
// orders itself after every stream's work, the capturing one's included,
// which would pull the free into the capture.
namespace {
thread_local std::unique_ptr<detail::CaptureExclusive> t_capture_hold;
thread_local std::vector<std::pair<int, void*>> t_deferred_frees;  // (device or -1 for pinned, pointer)
void release_deferred_frees() noexcept {
  std::vector<std::pair<int, void*>> frees;
  frees.swap(t_deferred_frees);
  for (auto [device, p] : frees) {
    if (device < 0) pinned_free(p);
    else cuda_free(device, p);
  }
}
}  // namespace

void* cuda_alloc(int device, size_t bytes) {
  static const int visible = cuda_device_count();
  FANOUT_USER_CHECK(device >= 0 && device < visible)
      << "cuda:" << device << " is not a visible CUDA device (" << visible << " visible)";
  configure_pools();
  detail::CaptureShared capture_safe;
  DeviceGuard g(device);
  void* p = nullptr;
  // Allocations on the legacy stream are ordered before any later work, so a
  // tensor may be used from any stream of its device.
  const cudaError_t e = plain_alloc() ? cudaMalloc(&p, bytes) : cudaMallocAsync(&p, bytes, nullptr);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    FANOUT_FAIL() << "out of memory on cuda:" << device << ": cannot allocate " << format_bytes(bytes) << " ("
                  << format_bytes(free_b) << " free of " << format_bytes(total_b)
                  << "); a smaller batch needs less";
  }
  FANOUT_CUDA_CHECK(e);
  return p;
}
void cuda_free(int device, void* p) noexcept {
  if (t_capture_hold) {
    t_deferred_frees.emplace_back(device, p);
    return;
  }
  detail::CaptureShared capture_safe;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  if (plain_alloc()) {
    if (cudaFree(p) != cudaSuccess) cudaGetLastError();
    cudaSetDevice(prev);
    return;
  }
  // The block may still be in use on any stream of the device: the free is
  // queued on a stream that first waits for the work queued so far on every
  // stream (the legacy one included). Nothing waits on the host.
  cudaError_t e = cudaSuccess;
  {
    StreamRegistry& r = streams();
    std::lock_guard<std::mutex> g(r.mu);
    cudaStream_t& fs = r.free_stream[device];
    if (!fs) e = cudaStreamCreateWithFlags(&fs, cudaStreamNonBlocking);
    auto& live = r.live[device];
    if (e == cudaSuccess && !live.count(nullptr)) {
      cudaEvent_t ev = nullptr;
      e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      if (e == cudaSuccess) live[nullptr] = ev;
    }
    for (auto it = live.begin(); e == cudaSuccess && it != live.end(); ++it) {
      e = cudaEventRecord(it->second, it->first);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(fs, it->second, 0);
    }
    if (e == cudaSuccess) e = cudaFreeAsync(p, fs);
  }
  if (e != cudaSuccess) {
    // Cannot throw here; say so once and clear the error, so that it is not
    // reported later against an unrelated call.
    static std::once_flag warned;
    std::call_once(warned, [e] {
      std::fprintf(stderr, "fanout: warning: freeing CUDA memory failed: %s (%s)\n", cudaGetErrorName(e),
                   cudaGetErrorString(e));
    });
    cudaGetLastError();
  }
  cudaSetDevice(prev);
}
void* pinned_alloc(size_t bytes) {
  detail::CaptureShared capture_safe;
  void* p = nullptr;
  FANOUT_CUDA_CHECK(cudaMallocHost(&p, bytes));
  return p;
}
void pinned_free(void* p) noexcept {
  if (t_capture_hold) {
    t_deferred_frees.emplace_back(-1, p);
    return;
  }
  detail::CaptureShared capture_safe;
  cudaFreeHost(p);
}

void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t bytes, void* stream) {
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  auto s = static_cast<cudaStream_t>(stream);
  detail::CaptureShared capture_safe;
  if (dd.is_cuda() && sd.is_cuda() && dd.index != sd.index) {
    FANOUT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dd.index, src, sd.index, bytes, s));
  } else {
    DeviceGuard g(dd.is_cuda() ? dd.index : sd.index);
    FANOUT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  }
  if (!stream) FANOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // no stream given: complete on return
}

void* stream_create(int device) {
  DeviceGuard g(device);
  cudaStream_t s;
  FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e;
  FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  StreamRegistry& r = streams();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live[device][s] = e;
  return s;
}
void stream_destroy(int device, void* s) noexcept {
  {
    StreamRegistry& r = streams();
    std::lock_guard<std::mutex> lock(r.mu);
    auto& live = r.live[device];
    auto it = live.find(static_cast<cudaStream_t>(s));
    if (it != live.end()) {
      cudaEventDestroy(it->second);
      live.erase(it);
    }
  }
  // Later frees no longer wait for this stream: let its queued work finish.
  cudaStreamSynchronize(static_cast<cudaStream_t>(s));
  cudaStreamDestroy(static_cast<cudaStream_t>(s));
}
void stream_sync(int device, void* s) { FANOUT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }
void* event_create(int device) {
  DeviceGuard g(device);
  cudaEvent_t e;
  FANOUT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void event_destroy(int device, void* e) noexcept { cudaEventDestroy(static_cast<cudaEvent_t>(e)); }
void event_record(int device, void* e, void* s) {
  FANOUT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
}
void event_wait(int device, void* e, void* s) {
  FANOUT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
}
void event_sync(int device, void* e) { FANOUT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e))); }

void graph_capture_begin(int device, void* stream) {
  FANOUT_CHECK(!t_capture_hold) << "this thread is capturing a graph already";
  DeviceGuard g(device);
  t_capture_hold = std::make_unique<detail::CaptureExclusive>();
  const cudaError_t e =
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    cudaGetLastError();
    t_capture_hold.reset();
    FANOUT_CUDA_CHECK(e);
  }
}
void* graph_capture_end(int device, void* stream, std::string* why) {
  // First out of capture mode and the lock released, whatever follows.
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  t_capture_hold.reset();
  // Memory freed inside the capture goes back to the pool now, before the
  // graph ever runs: the graph's kernels may still write it, so no graph.
  const bool freed = !t_deferred_frees.empty();
  release_deferred_frees();
  cudaGraphExec_t exec = nullptr;
  int prev = -1;
  cudaGetDevice(&prev);
  if (e == cudaSuccess && graph && !freed) {
    cudaSetDevice(device);
    e = cudaGraphInstantiate(&exec, graph, 0);
    cudaSetDevice(prev);
  }
  if (graph) cudaGraphDestroy(graph);
  if (e != cudaSuccess || !exec) {
    // Capture errors are not sticky; clear the last one so that it is not
    // reported against an unrelated call.
    cudaGetLastError();
    if (why)
      *why = e != cudaSuccess ? std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"
             : freed          ? std::string("the step freed device memory while it was captured")
                              : std::string("the capture gave no graph");
    return nullptr;
  }
  return exec;
}
void graph_launch(int device, void* exec, void* stream) {
  DeviceGuard g(device);
  FANOUT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)));
}
void graph_destroy(int device, void* exec) noexcept {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  cudaSetDevice(prev);
}

namespace {
// Each cuBLAS handle's own workspace (freed with the handle).
std::mutex g_cublas_ws_mu;
std::unordered_map<cublasHandle_t, void*> g_cublas_ws;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
}  // namespace

void* cublas_create(int device, void* stream) {
  detail::CaptureShared capture_safe;  // creating allocates (the workspace too): not while another thread captures
  DeviceGuard g(device);
  cublasHandle_t h;
  FANOUT_CUBLAS_CHECK(cublasCreate(&h));
  void* ws = nullptr;
  try {
    FANOUT_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream)));
    // A workspace of the handle's own, set after the stream (setting a stream
    // resets it): cuBLAS then allocates nothing inside a captured step.
    FANOUT_CUDA_CHECK(cudaMalloc(&ws, kCublasWorkspaceBytes));
    FANOUT_CUBLAS_CHECK(cublasSetWorkspace(h, ws, kCublasWorkspaceBytes));
    // A low-type C is rounded once: no split-K partial sums in its type.
    FANOUT_CUBLAS_CHECK(cublasSetMathMode(h, static_cast<cublasMath_t>(
                                                 CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  } catch (...) {
    cublasDestroy(h);
    if (ws) cudaFree(ws);
    throw;
  }
  std::lock_guard<std::mutex> lock(g_cublas_ws_mu);
  g_cublas_ws[h] = ws;
  return h;
}
void cublas_destroy(int device, void* h) noexcept {
  const auto handle = static_cast<cublasHandle_t>(h);
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  cublasDestroy(handle);
  void* ws = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_cublas_ws_mu);
    if (auto it = g_cublas_ws.find(handle); it != g_cublas_ws.end()) {
      ws = it->second;
      g_cublas_ws.erase(it);
    }
  }
  if (ws) cudaFree(ws);
  cudaSetDevice(prev);
}
void* cudnn_create(int device, void* stream) {
  detail::CaptureShared capture_safe;
  DeviceGuard g(device);
  cudnnHandle_t h;
  FANOUT_CUDNN_CHECK(cudnnCreate(&h));
  FANOUT_CUDNN_CHECK(cudnnSetStream(h, static_cast<cudaStream_t>(stream)));
  return h;
}
void cudnn_destroy(int device, void* h) noexcept { cudnnDestroy(static_cast<cudnnHandle_t>(h)); }

}  // namespace backend
}  // namespace fanout
