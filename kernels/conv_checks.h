// The entry-point checks shared by the 2-D and 3-D convolutions (kernels/
// conv2d.h, conv3d.h): the rank only changes how many spatial axes there are.
#pragma once
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels::detail {

// One convolution's rank and geometry, the same stride and padding on every axis.
struct ConvSpec {
  const char* family;  // "conv2d" or "conv3d", the prefix of shape errors
  int spatial;         // 2 or 3
  int64_t stride, padding;
};

// Output shape for x (N, C, spatial...) and w (OC, C, kernel...); throws on impossible shapes.
Shape conv_output_shape(const ConvSpec& s, const Shape& x, const Shape& w);

// forward: x, w, y on the context, y of the output shape, bias (OC) when given.
void check_conv_forward(const Context& ctx, const char* op, const ConvSpec& s, const Tensor& x, const Tensor& w,
                        const Tensor* b, const Tensor& y);

// backward: dy of the output shape, dw as w, db (OC) of dw's dtype, dx as x.
void check_conv_backward(const Context& ctx, const char* op, const ConvSpec& s, const Tensor& x, const Tensor& w,
                         const Tensor& dy, const Tensor* dx, const Tensor& dw, const Tensor* db);

}  // namespace fanout::kernels::detail
