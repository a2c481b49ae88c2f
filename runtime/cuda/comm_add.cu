// dst += src on a stream: the add of the p2p communicator (its CPU
// counterpart is the loop in runtime/parallel/cpu_comm.cpp).
#include "runtime/cuda/comm_add.h"
#include "runtime/cuda/cuda_check.h"

namespace fanout::cuda_comm {
namespace {
__global__ void add_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}
}  // namespace

void add_inplace(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 8192));
  add_kernel<<<blocks, threads, 0, stream>>>(dst, src, n);
  FANOUT_CUDA_CHECK_LAUNCH();
}
}  // namespace fanout::cuda_comm
