// The runtime's own elementwise CUDA work, on the shared launch path
// (runtime/cuda/launch.cuh): Tensor::fill / zero (CPU counterpart in
// Tensor::fill) and the p2p communicator's add (CPU counterpart: the loop in
// runtime/parallel/cpu_comm.cpp).
#include "runtime/core/memory.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/launch.cuh"

namespace fanout {
namespace {
struct FillOp {
  float v;
  __device__ float operator()(float) const { return v; }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
}  // namespace

void backend::fill_f32_cuda(int device, float* p, size_t n, float v, void* stream) {
  if (n == 0) return;
  int prev = 0;
  FANOUT_CUDA_CHECK(cudaGetDevice(&prev));
  FANOUT_CUDA_CHECK(cudaSetDevice(device));
  const auto st = static_cast<cudaStream_t>(stream);
  cuda_launch::map1(device, st, FillOp{v}, p, p, static_cast<int64_t>(n));
  if (!stream) FANOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  FANOUT_CUDA_CHECK(cudaSetDevice(prev));
}

void cuda_comm::add_inplace(int device, float* dst, const float* src, size_t n, cudaStream_t stream) {
  cuda_launch::map2(device, stream, AddOp{}, dst, src, dst, static_cast<int64_t>(n));
}
}  // namespace fanout
