// CUDA elementwise arithmetic (add, axpy, scale); CPU counterparts in
// kernels/cpu/elementwise.cpp. Grid-stride map kernels with a float4 path.
#include "kernels/elementwise.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/low_precision.cuh"

namespace fanout::kernels::cuda {

namespace {
struct AddOp {
  int low;  // detail::round_low's mode
  __device__ float operator()(float a, float b) const { return detail::round_low(a + b, low); }
};
// (x, y) -> y + alpha * x
struct AxpyOp {
  float alpha;
  __device__ float operator()(float x, float y) const { return y + alpha * x; }
};
struct ScaleOp {
  float alpha;
  __device__ float operator()(float x) const { return x * alpha; }
};
}  // namespace

// out = a + b (=), rounded as it is written when `round` is a low type; out may alias a or b.
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out, DType round) {
  detail::DeviceScope scope(ctx);
  detail::launch_storage_map2(ctx, AddOp{detail::low_mode(round)}, a, b, out);
}

// y += alpha * x.
void axpy(Context& ctx, float alpha, const Tensor& x, Tensor& y) {
  detail::DeviceScope scope(ctx);
  detail::launch_map2(ctx, AxpyOp{alpha}, x.f32(), y.f32(), y.f32(), y.numel());
}

// x *= alpha.
void scale(Context& ctx, float alpha, Tensor& x) {
  detail::DeviceScope scope(ctx);
  detail::launch_map1(ctx, ScaleOp{alpha}, x.f32(), x.f32(), x.numel());
}

}  // namespace fanout::kernels::cuda
