// CUDA softmax cross-entropy (max-subtracted, one warp per row, sums in
// double) with PyTorch's label smoothing, its backward, and accuracy counting;
// CPU counterparts in kernels/cpu/loss.cpp. Labels are not range-checked on
// the host (that would need a sync): a row with a label outside [0, K) gets a
// NaN loss, so the batch loss is NaN, and NaN gradients in backward; a row
// labelled kIgnoreLabel (-1) gets loss and gradient 0.
#include "kernels/loss.h"

#include "kernels/cuda/common.cuh"

namespace fanout::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;  // rows per block in the row kernels (256 threads)

// One warp per row: probs (=) and the row's loss into row_loss (double) and,
// when given, row_loss_f (float).
//   p = exp(z - max) / sum; loss = (1 - s) * (-log p_y) + s * mean_k(-log p_k)
__global__ void xent_forward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int64_t n,
                                    int64_t k, double smoothing, float* __restrict__ probs,
                                    double* __restrict__ row_loss, float* __restrict__ row_loss_f) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5);
  if (row >= n) return;  // whole warps leave together
  const float* z = logits + row * k;
  float* p = probs + row * k;
  float m = -CUDART_INF_F;
  for (int64_t j = lane; j < k; j += 32) m = fmaxf(m, z[j]);
  m = detail::warp_max(m);
  // Read the label's logit before probs are written (in case they alias).
  const int32_t y = labels[row];
  const bool valid = y >= 0 && y < k, ignored = y == kIgnoreLabel;
  const double zy = valid ? static_cast<double>(z[y]) : 0.0;
  double sum = 0.0, sum_shifted = 0.0;
  for (int64_t j = lane; j < k; j += 32) {
    const float zj = z[j];
    const float e = expf(zj - m);
    p[j] = e;
    sum += e;
    sum_shifted += static_cast<double>(zj) - m;
  }
  // Full-warp sums, broadcast to every lane.
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    sum_shifted += __shfl_xor_sync(0xffffffffu, sum_shifted, o);
  }
  const float inv = static_cast<float>(1.0 / sum);
  __syncwarp();
  for (int64_t j = lane; j < k; j += 32) p[j] *= inv;
  if (lane == 0) {
    const double lse = log(sum);
    const double nll = lse - (zy - m);
    const double mean_nll = lse - sum_shifted / static_cast<double>(k);
    const double li = valid ? (1.0 - smoothing) * nll + smoothing * mean_nll : ignored ? 0.0 : CUDART_NAN;
    row_loss[row] = li;
    if (row_loss_f) row_loss_f[row] = static_cast<float>(li);
  }
}

// loss[0] = mean of row_loss over the rows not ignored, one block, fixed order (deterministic).
__global__ void __launch_bounds__(1024) mean_kernel(const double* __restrict__ row_loss,
                                                    const int32_t* __restrict__ labels, int64_t n,
                                                    float* __restrict__ loss) {
  double a = 0.0, counted = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    a += row_loss[i];
    counted += labels[i] == kIgnoreLabel ? 0.0 : 1.0;
  }
  detail::block_sum2(a, counted);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(a / counted);  // NaN when every row is ignored
}

// dlogits = scale * (probs - ((1 - s) * onehot + s / K)); NaN rows for bad labels.
// dlogits may alias probs.
template <class I>
__global__ void xent_backward_kernel(const float* probs, const int32_t* __restrict__ labels, I k, I total, float off,
                                     float on, float scale, float* dlogits) {
  for (I i : detail::grid_stride(total)) {
    const I row = i / k, j = i - row * k;
    const int32_t y = labels[row];
    float d = scale * (probs[i] - off);
    if (j == static_cast<I>(y)) d -= scale * on;
    if (y == kIgnoreLabel) d = 0.0f;
    else if (y < 0 || static_cast<I>(y) >= k) d = CUDART_NAN_F;
    dlogits[i] = d;
  }
}

// torch.argmax order: a NaN beats everything (the first NaN wins), then the
// larger value, then the smaller index. idx < 0 marks an empty candidate.
struct ArgBest {
  float v;
  int64_t idx;
};
__device__ __forceinline__ bool better(const ArgBest& a, const ArgBest& b) {  // a strictly before b
  if (a.idx < 0) return false;
  if (b.idx < 0) return true;
  const bool an = isnan(a.v), bn = isnan(b.v);
  if (an != bn) return an;
  if (!an && a.v != b.v) return a.v > b.v;
  return a.idx < b.idx;
}

// The best of v[j] for j = first, first + step, ... below n, then the best
// over the warp (in every lane).
__device__ __forceinline__ ArgBest warp_best(const float* v, int64_t first, int64_t n, int64_t step) {
  ArgBest best{0.0f, -1};
  for (int64_t j = first; j < n; j += step) {
    const ArgBest c{v[j], j};
    if (better(c, best)) best = c;
  }
  for (int o = 16; o > 0; o >>= 1) {
    ArgBest other{__shfl_xor_sync(0xffffffffu, best.v, o),
                  static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(best.idx), o))};
    if (better(other, best)) best = other;
  }
  return best;
}

// One warp per row; per block, the hits are summed and added to correct[0].
__global__ void count_correct_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int64_t n,
                                     int64_t k, int32_t* __restrict__ correct) {
  __shared__ int hits[kWarpsPerBlock];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row = blockIdx.x * int64_t{kWarpsPerBlock} + warp;
  int hit = 0;
  if (row < n) {
    const ArgBest best = warp_best(logits + row * k, lane, k, 32);
    hit = best.idx == static_cast<int64_t>(labels[row]) ? 1 : 0;
  }
  if (lane == 0) hits[warp] = hit;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) s += hits[w];
    if (s) atomicAdd(correct, s);  // integer: exact in any order
  }
}

// One block per row: the row's sum of squared differences in double (fixed
// order: deterministic) and, when grad is given, grad = gs * (out - target).
__global__ void __launch_bounds__(1024)
    mse_kernel(const float* out, const float* __restrict__ target, int64_t e, float gs, float* __restrict__ row_loss,
               float* grad) {
  const int64_t row = blockIdx.x;
  const float* o = out + row * e;
  const float* t = target + row * e;
  double a = 0.0, unused = 0.0;
  for (int64_t j = threadIdx.x; j < e; j += blockDim.x) {
    const float d = __fsub_rn(o[j], t[j]);
    a += static_cast<double>(d) * d;
    if (grad) grad[row * e + j] = __fmul_rn(gs, d);  // after reading o[j]: grad may alias out
  }
  detail::block_sum2(a, unused);
  if (threadIdx.x == 0) row_loss[row] = static_cast<float>(a / static_cast<double>(e));
}

// One block per plane: torch.argmax order through better().
constexpr int kArgmaxThreads = 256;
__global__ void plane_argmax_kernel(const float* __restrict__ x, int64_t s, int32_t* __restrict__ idx,
                                    float* __restrict__ val) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ long long si[kArgmaxThreads / 32];
  ArgBest best = warp_best(x + static_cast<int64_t>(blockIdx.x) * s, threadIdx.x, s, blockDim.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best.v;
    si[warp] = best.idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) {
      const ArgBest other{sv[w], si[w]};
      if (better(other, best)) best = other;
    }
    idx[blockIdx.x] = static_cast<int32_t>(best.idx);
    val[blockIdx.x] = best.v;
  }
}

int row_blocks(int64_t n) {
  const int64_t b = detail::ceil_div(n, kWarpsPerBlock);
  FANOUT_CHECK(b <= INT32_MAX) << "softmax cross-entropy: " << n << " rows";
  return static_cast<int>(b);
}

}  // namespace

void softmax_xent_forward(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& probs,
                          Tensor& loss, Tensor* row_loss_f) {
  const int64_t n = logits.size(0), k = logits.size(1);  // N, K >= 1 (checked by the entry point)
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  auto* row_loss = static_cast<double*>(ctx.workspace(sizeof(double) * static_cast<size_t>(n)));
  xent_forward_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st>>>(
      logits.f32(), labels.data<int32_t>(), n, k, static_cast<double>(smoothing), probs.f32(), row_loss,
      row_loss_f ? row_loss_f->f32() : nullptr);
  FANOUT_CUDA_CHECK_LAUNCH();
  mean_kernel<<<1, 1024, 0, st>>>(row_loss, labels.data<int32_t>(), n, loss.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

void softmax_xent_backward(Context& ctx, const Tensor& probs, const Tensor& labels, float smoothing, float scale,
                           Tensor& dlogits) {
  const int64_t k = probs.size(1), total = probs.numel();
  const float off = smoothing / static_cast<float>(k);  // target s/K off the label
  const float on = 1.0f - smoothing;                    // plus (1 - s) on the label
  detail::launch_per_element(ctx, total, total, [&](auto tag, int blocks, cudaStream_t st) {
    using I = decltype(tag);
    xent_backward_kernel<I><<<blocks, detail::kThreads, 0, st>>>(probs.f32(), labels.data<int32_t>(),
                                                                 static_cast<I>(k), static_cast<I>(total), off, on,
                                                                 scale, dlogits.f32());
  });
}

void count_correct(Context& ctx, const Tensor& logits, const Tensor& labels, Tensor& correct) {
  const int64_t n = logits.size(0), k = logits.size(1);
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  int32_t* out = correct.data<int32_t>();
  FANOUT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(int32_t), st));
  if (n == 0) return;
  count_correct_kernel<<<row_blocks(n), kWarpsPerBlock * 32, 0, st>>>(logits.f32(), labels.data<int32_t>(), n, k,
                                                                      out);
  FANOUT_CUDA_CHECK_LAUNCH();
}

void mse_forward(Context& ctx, const Tensor& out, const Tensor& target, float scale, Tensor& row_loss, Tensor* grad) {
  const int64_t n = out.size(0), e = out.numel() / n;
  FANOUT_CHECK(n <= INT32_MAX) << "mse_forward: " << n << " rows";
  detail::DeviceScope scope(ctx);
  const float gs = static_cast<float>(2.0 * scale / static_cast<double>(e));
  mse_kernel<<<static_cast<unsigned>(n), 1024, 0, detail::stream_of(ctx)>>>(
      out.f32(), target.f32(), e, gs, row_loss.f32(), grad ? grad->f32() : nullptr);
  FANOUT_CUDA_CHECK_LAUNCH();
}

void plane_argmax(Context& ctx, const Tensor& x, Tensor& idx, Tensor& val) {
  const int64_t p = x.size(0), s = x.size(1);
  FANOUT_CHECK(p <= INT32_MAX) << "plane_argmax: " << p << " planes";
  detail::DeviceScope scope(ctx);
  plane_argmax_kernel<<<static_cast<unsigned>(p), kArgmaxThreads, 0, detail::stream_of(ctx)>>>(
      x.f32(), s, idx.data<int32_t>(), val.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
