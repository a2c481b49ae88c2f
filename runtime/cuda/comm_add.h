// Elementwise add used by the CUDA communicators.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace fanout::cuda_comm {
void add_inplace(float* dst, const float* src, size_t n, cudaStream_t stream);
}
