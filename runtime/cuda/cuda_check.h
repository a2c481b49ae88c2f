// Check macros for CUDA runtime, cuBLAS, cuDNN and NCCL calls: a failure
// throws fanout::Error naming the call as written, file, line and the
// library's message.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "runtime/core/error.h"

#include <shared_mutex>

namespace fanout::detail {
const char* cublas_status_name(cublasStatus_t s);
// Held exclusively while cuDNN's timed algorithm search may capture a CUDA
// graph; shared around the calls that capture forbids in other threads
// (allocation, frees, device-wide and legacy-stream work).
std::shared_mutex& capture_guard();
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
