// cuDNN's fused flash attention (kernels/cuda/attention_cudnn.cu) for the
// CUDA attention ops (kernels/cuda/attention.cu), which take the widened
// float32 path when these return false: cuDNN refused, nothing written.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::cuda {

bool cudnn_attention_forward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                             Tensor& y, Tensor& lse);
bool cudnn_attention_backward(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, float scale,
                              const Tensor& y, const Tensor& lse, const Tensor& dy, Tensor& dq, Tensor& dk,
                              Tensor& dv);

}  // namespace fanout::kernels::cuda
