// Fill kernel used by Tensor::fill / zero on CUDA tensors, with its CPU counterpart in Tensor::fill.
#include "runtime/core/memory.h"
#include "runtime/cuda/cuda_check.h"

namespace fanout::backend {
namespace {
__global__ void fill_kernel(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}
}  // namespace

void fill_f32_cuda(int device, float* p, size_t n, float v, void* stream) {
  if (n == 0) return;
  int prev = 0;
  FANOUT_CUDA_CHECK(cudaGetDevice(&prev));
  FANOUT_CUDA_CHECK(cudaSetDevice(device));
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 4096));
  fill_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(p, n, v);
  FANOUT_CUDA_CHECK_LAUNCH();
  if (!stream) FANOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  FANOUT_CUDA_CHECK(cudaSetDevice(prev));
}
}  // namespace fanout::backend
