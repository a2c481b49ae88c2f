// Elementwise activations: ReLU (in place when the layer asks), and the
// smooth ones torch.nn names Tanh, Sigmoid, GELU (exact, erf), SiLU and
// LeakyReLU, whose backward reads the forward's input. Every op reads and
// writes float32, bfloat16 or float16 tensors (all operands of one type and
// memory format) and computes in float32, rounding as it writes.
#pragma once
#include <cstdint>

#include "kernels/declare.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fanout::kernels {

enum class Act : uint8_t { Tanh, Sigmoid, Gelu, Silu, LeakyRelu };
struct Activation {
  Act kind = Act::Tanh;
  float negative_slope = 0.01f;  // LeakyReLU
};
// torch.nn's class name: "Tanh", "Sigmoid", "GELU", "SiLU", "LeakyReLU".
const char* activation_name(Act kind);

FANOUT_KERNEL_OPS(
// y = max(x, 0), written (=). y may alias x.
void relu_forward(Context& ctx, const Tensor& x, Tensor& y);
// dx = dy where y > 0 else 0, written (=). dx may alias dy.
void relu_backward(Context& ctx, const Tensor& y, const Tensor& dy, Tensor& dx);
// y = f(x), written (=). y may alias x.
//   Tanh tanh(x); Sigmoid 1 / (1 + exp(-x)); GELU x * (1 + erf(x / sqrt 2)) / 2;
//   SiLU x * sigmoid(x); LeakyReLU x > 0 ? x : slope * x.
void activation_forward(Context& ctx, const Activation& a, const Tensor& x, Tensor& y);
// dx = dy * f'(x) from the forward's input x, written (=). dx may alias dy.
void activation_backward(Context& ctx, const Activation& a, const Tensor& x, const Tensor& dy, Tensor& dx);
)

}  // namespace fanout::kernels
