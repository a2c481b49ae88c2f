// CUDA embedding, the CPU kernel's results (kernels/cpu/embedding.cpp):
// forward gathers rows, a thread per output element, NaN rows for ids
// outside [0, V).
// Backward sorts (id, position) pairs with CUB's radix sort (stable, so each
// id's positions stay ascending; bad ids become the key V and are skipped),
// then the block that starts each run of equal ids sums the run's rows in
// order in double, a thread per column, and adds the sum to dweight: the
// CPU's arithmetic, so the two agree bit for bit; no atomics. The pairs and
// CUB's temporaries live in the context's workspace (no allocation once
// warmed up).
#include <cub/device/device_radix_sort.cuh>

#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"

namespace fanout::kernels::cuda {

namespace {

constexpr int kColumnThreads = 128;

template <class I>
__global__ void embedding_forward_kernel(const int32_t* __restrict__ ids, const float* __restrict__ w, I v, I e,
                                         I total, float* __restrict__ y) {
  for (I i : detail::grid_stride(total)) {
    const I p = i / e, c = i - p * e;
    const I id = static_cast<I>(ids[p]);
    y[i] = id >= 0 && id < v ? w[id * e + c] : CUDART_NAN_F;
  }
}

// keys (n) = the id, or v for a bad one; vals (n) = the position.
__global__ void pairs_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t v, uint32_t* keys, int32_t* vals) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < n; p += int64_t{gridDim.x} * blockDim.x) {
    const int64_t id = ids[p];
    keys[p] = static_cast<uint32_t>(id >= 0 && id < v ? id : v);
    vals[p] = static_cast<int32_t>(p);
  }
}

// Block x: sorted index i; threads over columns (grid y). Only the block at
// a run's start works: it sums the run's rows in order.
__global__ void __launch_bounds__(kColumnThreads)
    embedding_backward_kernel(const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos, int64_t n,
                              uint32_t v, int64_t e, const float* __restrict__ dy, float* __restrict__ dweight) {
  const int64_t i = blockIdx.x;
  const uint32_t key = keys[i];
  if (key == v || (i > 0 && keys[i - 1] == key)) return;
  const int64_t c = blockIdx.y * int64_t{kColumnThreads} + threadIdx.x;
  if (c >= e) return;
  double acc = 0.0;
  for (int64_t j = i; j < n && keys[j] == key; ++j) acc += dy[pos[j] * e + c];
  dweight[key * e + c] += static_cast<float>(acc);
}

size_t round_up(size_t b) { return (b + 255) / 256 * 256; }

int key_bits(int64_t v) {  // bits holding every key in [0, v]
  int b = 1;
  while ((int64_t{1} << b) <= v) ++b;
  return b;
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& ids, const Tensor& weight, Tensor& y) {
  const int64_t n = ids.numel(), v = weight.size(0), e = weight.size(1);
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  detail::launch_per_element(ctx, n * e, std::max(n, v) * e, [&](auto tag, int blocks, cudaStream_t s) {
    using I = decltype(tag);
    embedding_forward_kernel<I><<<blocks, detail::kThreads, 0, s>>>(ids.data<int32_t>(), weight.f32(), I(v), I(e),
                                                                   I(n * e), y.f32());
  });
}

void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dy, Tensor& dweight) {
  const int64_t n = ids.numel(), v = dweight.size(0), e = dweight.size(1);
  const int64_t col_blocks = (e + kColumnThreads - 1) / kColumnThreads;
  FANOUT_CHECK(col_blocks <= 65535) << "embedding_backward: rows of " << e << " values";
  detail::DeviceScope scope(ctx);
  cudaStream_t st = detail::stream_of(ctx);
  const int bits = key_bits(v);
  const int num = static_cast<int>(n);
  // [keys (2 n) | positions (2 n) | CUB's temporaries], each 256-aligned.
  size_t temp = 0;
  cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> vals(nullptr, nullptr);
  FANOUT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp, keys, vals, num, 0, bits, st));
  const size_t kb = round_up(sizeof(uint32_t) * static_cast<size_t>(n));
  const size_t vb = round_up(sizeof(int32_t) * static_cast<size_t>(n));
  char* ws = static_cast<char*>(ctx.workspace(2 * kb + 2 * vb + temp));
  keys = cub::DoubleBuffer<uint32_t>(reinterpret_cast<uint32_t*>(ws), reinterpret_cast<uint32_t*>(ws + kb));
  vals = cub::DoubleBuffer<int32_t>(reinterpret_cast<int32_t*>(ws + 2 * kb),
                                    reinterpret_cast<int32_t*>(ws + 2 * kb + vb));
  pairs_kernel<<<detail::grid_for(ctx, n), detail::kThreads, 0, st>>>(ids.data<int32_t>(), n, v, keys.Current(),
                                                                     vals.Current());
  FANOUT_CUDA_CHECK_LAUNCH();
  FANOUT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + 2 * kb + 2 * vb, temp, keys, vals, num, 0, bits, st));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(col_blocks));
  embedding_backward_kernel<<<grid, kColumnThreads, 0, st>>>(
      keys.Current(), vals.Current(), n, static_cast<uint32_t>(v), e, dy.f32(), dweight.f32());
  FANOUT_CUDA_CHECK_LAUNCH();
}

}  // namespace fanout::kernels::cuda
