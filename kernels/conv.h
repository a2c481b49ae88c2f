// 2-D and 3-D convolution (cross-correlation, as PyTorch's Conv2d and
// Conv3d), groups = 1, dilation = 1, over (N, C, H, W) or (N, C, D, H, W):
// one op family for both ranks, the rank (2 or 3 spatial axes) an argument.
// CPU: oneDNN (kernels/cpu/conv.cpp). CUDA: cuDNN (kernels/cuda/conv.cu).
// Under autocast (ctx.math.autocast BF16 or F16) CUDA runs cuDNN in that
// type, rounding x, w, dy, y, dx and the dw term to it; the CPU computes in
// float32 on what it is given (the layers pass it rounded copies). x, y, dy
// and dx may be float32, bfloat16 or float16 in either memory format
// (staged, kernels/staging.h; CUDA under autocast takes them in the autocast
// type as they are, unless a bias is added or summed); w, b and the
// gradients dw, db are float32.
#pragma once
#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

// The same stride and padding on every spatial axis.
struct ConvGeometry {
  int64_t stride = 1;
  int64_t padding = 0;
};
using Conv2dGeometry = ConvGeometry;
using Conv3dGeometry = ConvGeometry;

// Output shape for x (N, C, spatial...) and w (OC, C, kernel...) with
// `spatial` (2 or 3) spatial axes; throws on impossible shapes.
Shape conv_output_shape(int spatial, const Shape& x, const Shape& w, const ConvGeometry& g);

FANOUT_KERNEL_OPS(
// Whether, under the context's autocast, conv_forward and conv_backward round
// in the low type themselves: x, w and dy rounded as they are read for the
// products (db is still summed from dy as given), y (CUDA: before its bias,
// which is added and rounded again; CPU: after it), dx and the dw term
// returned rounded. CUDA: yes (cuDNN runs in the low type); CPU: under bf16
// autocast where oneDNN multiplies bfloat16 natively (AVX-512 BF16, AMX)
// outside split-invariant math, otherwise no (float32 on the values it is
// given). The layers then skip the copies and passes that would repeat those
// roundings (runtime/nn/autocast.h).
bool conv_rounds_in_low_type(const Context& ctx);
// y (N, OC, out...) is written (=); b (OC) or null.
void conv_forward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor* b,
                  const ConvGeometry& g, Tensor& y);
// dx (=) when non-null; dw (+=) when defined; db (+=) when non-null.
void conv_backward(Context& ctx, int spatial, const Tensor& x, const Tensor& w, const Tensor& dy,
                   const ConvGeometry& g, Tensor* dx, Tensor& dw, Tensor* db);
)

// The ranks by name (the layers', PyTorch's).
inline Shape conv2d_output_shape(const Shape& x, const Shape& w, const ConvGeometry& g) {
  return conv_output_shape(2, x, w, g);
}
inline void conv2d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const ConvGeometry& g,
                           Tensor& y) {
  conv_forward(ctx, 2, x, w, b, g, y);
}
inline void conv3d_forward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const ConvGeometry& g,
                           Tensor& y) {
  conv_forward(ctx, 3, x, w, b, g, y);
}
inline void conv2d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g,
                            Tensor* dx, Tensor& dw, Tensor* db) {
  conv_backward(ctx, 2, x, w, dy, g, dx, dw, db);
}
inline void conv3d_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g,
                            Tensor* dx, Tensor& dw, Tensor* db) {
  conv_backward(ctx, 3, x, w, dy, g, dx, dw, db);
}

}  // namespace fanout::kernels
