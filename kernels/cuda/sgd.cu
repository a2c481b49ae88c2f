// CUDA SGD: one fused elementwise kernel over the flat arena, exactly
// torch.optim.SGD (and kernels/cpu/sgd.cpp):
//   d = grad + wd * p; buf = first ? d : mu * buf + (1 - dampening) * d;
//   u = nesterov ? d + mu * buf : buf (u = d without momentum); p -= lr * u.
// float4 loads and stores when params, grads and the momentum buffer are
// 16-byte aligned (arena bases are), with a scalar tail.
#include "kernels/sgd.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

struct SgdArgs {
  float lr, wd, mu, damp;
  bool momentum, nesterov, first;
};

// One element. buf is touched only with momentum (without it, the caller may
// pass the gradient arena as the buffer).
__device__ __forceinline__ void sgd_one(const SgdArgs& h, float& p, float g, float& buf) {
  const float d = g + h.wd * p;
  if (!h.momentum) {
    p -= h.lr * d;
    return;
  }
  const float b = h.first ? d : h.mu * buf + h.damp * d;
  buf = b;
  p -= h.lr * (h.nesterov ? d + h.mu * b : b);
}

template <bool kVec>
__global__ void sgd_kernel(SgdArgs h, float* p, const float* g, float* buf, int64_t n) {
  const int64_t tid = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t begin = 0;
  if (kVec) {
    const int64_t n4 = n / 4;
    float4* p4 = reinterpret_cast<float4*>(p);
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* b4 = reinterpret_cast<float4*>(buf);
    for (int64_t i = tid; i < n4; i += stride) {
      float4 pv = p4[i];
      const float4 gv = g4[i];
      float4 bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (h.momentum && !h.first) bv = b4[i];
      sgd_one(h, pv.x, gv.x, bv.x);
      sgd_one(h, pv.y, gv.y, bv.y);
      sgd_one(h, pv.z, gv.z, bv.z);
      sgd_one(h, pv.w, gv.w, bv.w);
      p4[i] = pv;
      if (h.momentum) b4[i] = bv;
    }
    begin = n4 * 4;
  }
  for (int64_t i = begin + tid; i < n; i += stride) {
    float pv = p[i];
    float bv = (h.momentum && !h.first) ? buf[i] : 0.0f;
    sgd_one(h, pv, g[i], bv);
    p[i] = pv;
    if (h.momentum) buf[i] = bv;
  }
}

}  // namespace

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const SgdHyper& h, bool first) {
  const int64_t n = params.numel();
  if (n == 0) return;
  detail::DeviceScope scope(ctx);
  const SgdArgs a{h.lr, h.weight_decay, h.momentum, 1.0f - h.dampening, h.momentum != 0.0f, h.nesterov, first};
  float* p = params.f32();
  const float* g = grads.f32();
  // Without momentum the buffer is never read or written: pass the parameters
  // so that no undefined tensor is dereferenced on the host.
  float* buf = a.momentum ? momentum_buf.f32() : p;
  cudaStream_t st = detail::stream_of(ctx);
  if (detail::aligned16(p, g, buf)) {
    sgd_kernel<true><<<detail::grid_for(ctx, detail::ceil_div(n, 4)), detail::kThreads, 0, st>>>(a, p, g, buf, n);
  } else {
    sgd_kernel<false><<<detail::grid_for(ctx, n), detail::kThreads, 0, st>>>(a, p, g, buf, n);
  }
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
