// CUDA softmax cross-entropy with PyTorch's label smoothing, its accuracy
// count and its gradient in one kernel (max-subtracted, sums in double, a
// warp a row or a block a wide row, storage read natively), mean squared
// error and plane argmax; CPU counterparts in kernels/cpu/loss.cpp. Labels
// are not range-checked on the host (that would need a sync): a row with a
// label outside [0, K) gets a NaN loss, so the batch loss is NaN, and NaN
// gradients; a row labelled kIgnoreLabel (-1) gets loss and gradient 0.
#include "kernels/loss.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;  // rows per block in the warp-a-row kernels (256 threads)
constexpr int64_t kWideRow = 1024;  // cross-entropy rows above this many classes take a block each

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

// The best of the lanes' candidates, in every lane.
__device__ __forceinline__ ArgBest warp_best_of(ArgBest best) {
  for (int o = 16; o > 0; o >>= 1) {
    ArgBest other{__shfl_xor_sync(0xffffffffu, best.v, o),
                  static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(best.idx), o))};
    if (better(other, best)) best = other;
  }
  return best;
}

// The best of v[j] for j = first, first + step, ... below n, then the best
// over the warp (in every lane).
__device__ __forceinline__ ArgBest warp_best(const float* v, int64_t first, int64_t n, int64_t step) {
  ArgBest best{0.0f, -1};
  for (int64_t j = first; j < n; j += step) {
    const ArgBest c{v[j], j};
    if (better(c, best)) best = c;
  }
  return warp_best_of(best);
}

// The threads that share a row: a warp (kWarp: kWarpsPerBlock rows a block)
// or the whole block (one wide row a block). Reductions give every thread
// the result, in a fixed order (deterministic).
template <bool kWarp>
struct RowGroup;
template <>
struct RowGroup<true> {
  __device__ static int rank() { return threadIdx.x & 31; }
  __device__ static int size() { return 32; }
  __device__ static int64_t row() { return blockIdx.x * int64_t{kWarpsPerBlock} + (threadIdx.x >> 5); }
  __device__ static float max(float v) { return detail::warp_max(v); }
  __device__ static void sum2(double& a, double& b) {
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
  }
  __device__ static ArgBest best(ArgBest v) { return warp_best_of(v); }
  __device__ static void sync() { __syncwarp(); }
  // Adds the block's hits (lane 0 of each warp holds its row's) to *correct:
  // one atomic a block. Every thread of the block must call it.
  __device__ static void add_hits(bool hit, int32_t* correct) {
    __shared__ int hits[kWarpsPerBlock];
    if ((threadIdx.x & 31) == 0) hits[threadIdx.x >> 5] = hit ? 1 : 0;
    __syncthreads();
    if (threadIdx.x == 0) {
      int total = 0;
      for (int w = 0; w < kWarpsPerBlock; ++w) total += hits[w];
      if (total) atomicAdd(correct, total);  // integer: exact in any order
    }
  }
};
template <>
struct RowGroup<false> {
  __device__ static int rank() { return threadIdx.x; }
  __device__ static int size() { return blockDim.x; }
  __device__ static int64_t row() { return blockIdx.x; }
  __device__ static float max(float v) { return detail::block_max_all(v); }
  __device__ static void sum2(double& a, double& b) { detail::block_sum2_all(a, b); }
  __device__ static ArgBest best(ArgBest v) {
    __shared__ float sv[32];
    __shared__ long long si[32];
    v = warp_best_of(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) {
      sv[warp] = v.v;
      si[warp] = v.idx;
    }
    __syncthreads();
    v = ArgBest{sv[0], si[0]};
    for (int w = 1; w < warps; ++w) {
      const ArgBest other{sv[w], si[w]};
      if (better(other, v)) v = other;
    }
    __syncthreads();  // sv and si may be reused by a later call
    return v;
  }
  __device__ static void sync() { __syncthreads(); }
  __device__ static void add_hits(bool hit, int32_t* correct) {  // thread 0 holds the row's
    if (threadIdx.x == 0 && hit) atomicAdd(correct, 1);
  }
};

// One row for a thread group G (RowGroup): the loss into row_loss (double)
// and, when given, row_loss_f (float); dlogits (=), which may be logits;
// returns whether the row's argmax is its label (in rank 0; false elsewhere).
// Three reads of the row: the max (and torch's argmax), the sums, then the
// gradient, with
//   p = exp(z - max) / sum; loss = (1 - s) * (-log p_y) + s * mean_k(-log p_k)
//   dlogits = scale * (p - off) - scale * on [on the label], rounded by `round`.
template <class T, class G>
__device__ __forceinline__ bool xent_row(const T* z, int32_t y, int64_t row, int64_t k, double smoothing, float off,
                                         float on, float scale, int round, bool count, double* row_loss,
                                         float* row_loss_f, T* d) {
  const int first = G::rank(), step = G::size();
  float m = -CUDART_INF_F;
  ArgBest best{0.0f, -1};
  for (int64_t j = first; j < k; j += step) {
    const float v = detail::widen(z[j]);
    m = fmaxf(m, v);
    const ArgBest c{v, j};
    if (better(c, best)) best = c;
  }
  m = G::max(m);
  if (count) best = G::best(best);
  const bool valid = y >= 0 && y < k, ignored = y == kIgnoreLabel;
  const double zy = valid ? static_cast<double>(detail::widen(z[y])) : 0.0;
  double sum = 0.0, sum_shifted = 0.0;
  for (int64_t j = first; j < k; j += step) {
    const float zj = detail::widen(z[j]);
    sum += expf(zj - m);
    sum_shifted += static_cast<double>(zj) - m;
  }
  G::sum2(sum, sum_shifted);
  if (first == 0) {
    const double lse = log(sum);
    const double nll = lse - (zy - m);
    const double mean_nll = lse - sum_shifted / static_cast<double>(k);
    // Unfused, as the CPU computes it; no smoothing term at s = 0 (a -inf logit makes mean_nll inf).
    const double smoothed =
        smoothing > 0.0 ? __dadd_rn(__dmul_rn(1.0 - smoothing, nll), __dmul_rn(smoothing, mean_nll)) : nll;
    const double li = valid ? smoothed : ignored ? 0.0 : CUDART_NAN;
    row_loss[row] = li;
    if (row_loss_f) row_loss_f[row] = static_cast<float>(li);
  }
  const bool hit = first == 0 && count && best.idx == static_cast<int64_t>(y);
  if (!d) return hit;
  G::sync();  // every read of z[y] before any write over it (d may be z)
  const float inv = static_cast<float>(1.0 / sum), on_label = __fmul_rn(scale, on);
  for (int64_t j = first; j < k; j += step) {
    const float p = __fmul_rn(expf(detail::widen(z[j]) - m), inv);
    float g = __fmul_rn(scale, __fsub_rn(p, off));
    if (j == static_cast<int64_t>(y)) g = __fsub_rn(g, on_label);
    if (ignored) g = 0.0f;
    else if (!valid) g = CUDART_NAN_F;
    d[j] = detail::narrow<T>(detail::round_low(g, round));  // after reading z[j]: d may be z
  }
  return hit;
}

// A warp a row (kWarp, kWarpsPerBlock rows a block) or a block a wide row;
// hits reach correct in one atomic a block.
template <class T, bool kWarp>
__global__ void xent_kernel(const T* logits, const int32_t* __restrict__ labels, int64_t n, int64_t k,
                            double smoothing, float off, float on, float scale, int round,
                            double* __restrict__ row_loss, float* __restrict__ row_loss_f,
                            int32_t* __restrict__ correct, T* dlogits) {
  using G = RowGroup<kWarp>;
  const int64_t row = G::row();
  bool hit = false;
  if (row < n)  // whole warps take a row or not (the block form always does)
    hit = xent_row<T, G>(logits + row * k, labels[row], row, k, smoothing, off, on, scale, round, correct != nullptr,
                         row_loss, row_loss_f, dlogits ? dlogits + row * k : nullptr);
  if (correct) G::add_hits(hit, correct);
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


}  // namespace

void softmax_xent(Context& ctx, const Tensor& logits, const Tensor& labels, float smoothing, Tensor& loss,
                  const XentOutputs& out) {
  const int64_t n = logits.size(0), k = logits.size(1);  // N, K >= 1 (checked by the entry point)
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  auto* row_loss = static_cast<double*>(ctx.workspace(sizeof(double) * static_cast<size_t>(n)));
  int32_t* correct = out.correct ? out.correct->data<int32_t>() : nullptr;
  if (correct) FANOUT_CUDA_CHECK(cudaMemsetAsync(correct, 0, sizeof(int32_t), st));
  const float off = smoothing / static_cast<float>(k);  // target s/K off the label
  const float on = 1.0f - smoothing;                    // plus (1 - s) on the label
  const bool wide = k > kWideRow;
  FANOUT_CHECK(n <= INT32_MAX) << "softmax_xent: " << n << " rows";
  detail::with_storage(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* z = static_cast<const T*>(logits.raw());
    T* d = out.dlogits ? static_cast<T*>(out.dlogits->raw()) : nullptr;
    float* rf = out.row_loss ? out.row_loss->f32() : nullptr;
    const int mode = detail::low_mode(out.round);
    const unsigned blocks = static_cast<unsigned>(wide ? n : detail::ceil_div(n, kWarpsPerBlock));
    if (wide)
      xent_kernel<T, false><<<blocks, detail::kMaxRowThreads, 0, st>>>(
          z, labels.data<int32_t>(), n, k, static_cast<double>(smoothing), off, on, out.scale, mode, row_loss, rf,
          correct, d);
    else
      xent_kernel<T, true><<<blocks, kWarpsPerBlock * 32, 0, st>>>(
          z, labels.data<int32_t>(), n, k, static_cast<double>(smoothing), off, on, out.scale, mode, row_loss, rf,
          correct, d);
    FANOUT_CUDA_CHECK_LAUNCH();
  });
  mean_kernel<<<1, 1024, 0, st>>>(row_loss, labels.data<int32_t>(), n, loss.f32());
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
