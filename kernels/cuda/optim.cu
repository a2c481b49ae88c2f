// CUDA optimizer kernels, the same rules and order as kernels/cpu/optim.cpp
// (every rounding explicit, so no fused multiply-add changes a value):
// updates walk the chunk table (a block per chunk, grid-stride over chunks,
// so one launch covers a parameter group however its ranges lie in the
// arena); the sum of squares is CUB's TransformReduce in double, its
// temporaries in the context's workspace (no allocation once warmed up).
#include <cub/device/device_reduce.cuh>

#include <mutex>
#include <shared_mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/optim.h"

namespace fanout::kernels::cuda {

namespace {

constexpr int kMaxChunkBlocks = 65535;

int chunk_blocks(const Tensor& chunks) {
  return static_cast<int>(std::min<int64_t>(chunks.size(0), kMaxChunkBlocks));
}

__global__ void sgd_kernel(SgdStep h, float* p, const float* g, float* buf, const int64_t* chunks, int64_t k) {
  const float damp = 1.0f - h.dampening;
  for (int64_t c = blockIdx.x; c < k; c += gridDim.x) {
    const int64_t b = chunks[2 * c], e = b + chunks[2 * c + 1];
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
      // Explicit roundings (no fused multiply-adds): the CPU kernel's values.
      const float d = __fadd_rn(g[i], __fmul_rn(h.weight_decay, p[i]));
      if (!buf) {
        p[i] = __fsub_rn(p[i], __fmul_rn(h.lr, d));
        continue;
      }
      const float m = h.first ? d : __fadd_rn(__fmul_rn(h.momentum, buf[i]), __fmul_rn(damp, d));
      buf[i] = m;
      p[i] = __fsub_rn(p[i], __fmul_rn(h.lr, h.nesterov ? __fadd_rn(d, __fmul_rn(h.momentum, m)) : m));
    }
  }
}

__global__ void adam_kernel(AdamStep h, float* p, const float* gr, float* m, float* v, float* vmax,
                            const int64_t* chunks, int64_t k) {
  const float w = h.one_minus_beta1;
  for (int64_t c = blockIdx.x; c < k; c += gridDim.x) {
    const int64_t b = chunks[2 * c], e = b + chunks[2 * c + 1];
    for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
      const float pi = __fmul_rn(p[i], h.decay);
      const float g = __fadd_rn(gr[i], __fmul_rn(h.weight_decay, pi));
      const float mi = w < 0.5f ? __fadd_rn(m[i], __fmul_rn(w, __fsub_rn(g, m[i])))
                                : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m[i]), 1.0f - w));
      const float vi = __fadd_rn(__fmul_rn(h.beta2, v[i]), __fmul_rn(__fmul_rn(h.one_minus_beta2, g), g));
      float vd = vi;
      if (vmax) {
        vd = vmax[i] < vi ? vi : vmax[i];  // the CPU's expression (NaN handling included)
        vmax[i] = vd;
      }
      m[i] = mi;
      v[i] = vi;
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vd), h.bias_correction2_sqrt), h.eps);
      p[i] = __fsub_rn(pi, __fmul_rn(h.step_size, __fdiv_rn(mi, denom)));
    }
  }
}

struct Square {
  __device__ double operator()(float x) const { return static_cast<double>(x) * x; }
};

struct Plus {
  __device__ double operator()(double a, double b) const { return a + b; }
};

__global__ void clamp_kernel(float* x, int64_t n, float limit) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    if (!isnan(x[i])) x[i] = fminf(fmaxf(x[i], -limit), limit);
}

}  // namespace

void sgd_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& momentum_buf, const Tensor& chunks,
              const SgdStep& h) {
  if (chunks.size(0) == 0) return;
  detail::DeviceScope scope(ctx);
  float* buf = h.momentum != 0.0f ? momentum_buf.f32() : nullptr;
  sgd_kernel<<<chunk_blocks(chunks), detail::kThreads, 0, detail::stream_of(ctx)>>>(
      h, params.f32(), grads.f32(), buf, chunks.data<int64_t>(), chunks.size(0));
  FANOUT_CUDA_CHECK_LAUNCH();
}

void adam_step(Context& ctx, Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
               Tensor& max_exp_avg_sq, const Tensor& chunks, const AdamStep& h) {
  if (chunks.size(0) == 0) return;
  detail::DeviceScope scope(ctx);
  float* vmax = h.amsgrad ? max_exp_avg_sq.f32() : nullptr;
  adam_kernel<<<chunk_blocks(chunks), detail::kThreads, 0, detail::stream_of(ctx)>>>(
      h, params.f32(), grads.f32(), exp_avg.f32(), exp_avg_sq.f32(), vmax, chunks.data<int64_t>(), chunks.size(0));
  FANOUT_CUDA_CHECK_LAUNCH();
}

double sum_squares(Context& ctx, const Tensor& x) {
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  const int64_t n = x.numel();
  size_t temp = 0;
  FANOUT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(nullptr, temp, x.f32(), static_cast<double*>(nullptr), n,
                                                       Plus{}, Square{}, 0.0, st));
  // [result double | pad to 256 | CUB's temporaries]
  char* ws = static_cast<char*>(ctx.workspace(256 + temp));
  double* out = reinterpret_cast<double*>(ws);
  FANOUT_CUDA_CHECK(cub::DeviceReduce::TransformReduce(ws + 256, temp, x.f32(), out, n, Plus{}, Square{}, 0.0, st));
  double host = 0.0;
  ::fanout::detail::CaptureShared capture_safe;  // a pageable copy
  FANOUT_CUDA_CHECK(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, st));
  FANOUT_CUDA_CHECK(cudaStreamSynchronize(st));
  return host;
}

void clamp_abs(Context& ctx, Tensor& x, float limit) {
  const int64_t n = x.numel();
  if (n == 0) return;
  detail::DeviceScope scope(ctx);
  clamp_kernel<<<detail::grid_for(ctx, n), detail::kThreads, 0, detail::stream_of(ctx)>>>(x.f32(), n, limit);
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
