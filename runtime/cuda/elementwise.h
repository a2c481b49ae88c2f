// Elementwise add of the CUDA communicators (runtime/cuda/elementwise.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace fanout::cuda_comm {
// dst += src, n floats, on `stream`; `device` is current and holds both.
void add_inplace(int device, float* dst, const float* src, size_t n, cudaStream_t stream);
}  // namespace fanout::cuda_comm
