// Check macros for CUDA runtime, cuBLAS, cuDNN and NCCL calls: a failure
// throws fanout::Error naming the call as written, file, line and the
// library's message.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "runtime/core/error.h"

#include <mutex>
#include <shared_mutex>

namespace fanout::detail {
const char* cublas_status_name(cublasStatus_t s);
// Held exclusively while a CUDA graph is captured (cuDNN's timed algorithm
// search, a step capture: runtime/core/graph.h); shared around the calls
// that capture forbids in other threads (allocation, frees, device-wide and
// legacy-stream work). The thread holding it exclusively takes no shared
// hold (its own calls inside the capture fail the capture, as they should,
// instead of deadlocking).
std::shared_mutex& capture_guard();
bool& capture_guard_owner();  // this thread holds capture_guard exclusively
class CaptureShared {
 public:
  CaptureShared() {
    if (!capture_guard_owner()) lock_ = std::shared_lock<std::shared_mutex>(capture_guard());
  }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};
class CaptureExclusive {
 public:
  CaptureExclusive() {
    if (capture_guard_owner()) return;
    lock_ = std::unique_lock<std::shared_mutex>(capture_guard());
    capture_guard_owner() = true;
  }
  ~CaptureExclusive() {
    if (lock_.owns_lock()) capture_guard_owner() = false;
  }
  CaptureExclusive(const CaptureExclusive&) = delete;
  CaptureExclusive& operator=(const CaptureExclusive&) = delete;

 private:
  std::unique_lock<std::shared_mutex> lock_;
};
}

#define FANOUT_CUDA_CHECK(expr)                                                                 \
  do {                                                                                          \
    cudaError_t fanout_err_ = (expr);                                                           \
    if (fanout_err_ != cudaSuccess)                                                             \
      ::fanout::detail::Thrower() & ::fanout::detail::ErrorStream(__FILE__, __LINE__, #expr)      \
                                        << cudaGetErrorName(fanout_err_) << " ("                \
                                        << cudaGetErrorString(fanout_err_) << ")";              \
  } while (0)

// After a kernel launch: catches bad launch configurations at once.
#define FANOUT_CUDA_CHECK_LAUNCH() FANOUT_CUDA_CHECK(cudaGetLastError())

#define FANOUT_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                          \
    cublasStatus_t fanout_st_ = (expr);                                                         \
    if (fanout_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::fanout::detail::Thrower() & ::fanout::detail::ErrorStream(__FILE__, __LINE__, #expr)      \
                                        << ::fanout::detail::cublas_status_name(fanout_st_);    \
  } while (0)

#define FANOUT_CUDNN_CHECK(expr)                                                                \
  do {                                                                                          \
    cudnnStatus_t fanout_st_ = (expr);                                                          \
    if (fanout_st_ != CUDNN_STATUS_SUCCESS)                                                     \
      ::fanout::detail::Thrower() & ::fanout::detail::ErrorStream(__FILE__, __LINE__, #expr)      \
                                        << cudnnGetErrorString(fanout_st_);                     \
  } while (0)

#define FANOUT_NCCL_CHECK(expr)                                                                 \
  do {                                                                                          \
    ncclResult_t fanout_st_ = (expr);                                                           \
    if (fanout_st_ != ncclSuccess)                                                              \
      ::fanout::detail::Thrower() & ::fanout::detail::ErrorStream(__FILE__, __LINE__, #expr)      \
                                        << ncclGetErrorString(fanout_st_);                      \
  } while (0)
