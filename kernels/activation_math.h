// The smooth activations' formulas, one definition for the CPU and CUDA
// kernels (host and device): float arithmetic, torch's definitions.
#pragma once
#include <math.h>

#include <type_traits>

#include "kernels/activation.h"

#ifdef __CUDACC__
#define FANOUT_HD __host__ __device__ __forceinline__
#else
#define FANOUT_HD inline
#endif

namespace fanout::kernels::act {

FANOUT_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// y = f(x)
template <Act K>
FANOUT_HD float forward(float x, float slope) {
  if constexpr (K == Act::Tanh) return tanhf(x);
  if constexpr (K == Act::Sigmoid) return sigmoid(x);
  if constexpr (K == Act::Gelu) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  if constexpr (K == Act::Silu) return x * sigmoid(x);
  if constexpr (K == Act::LeakyRelu) return x > 0.0f ? x : slope * x;
  return x;
}

// dy * f'(x)
template <Act K>
FANOUT_HD float backward(float x, float dy, float slope) {
  if constexpr (K == Act::Tanh) {
    const float t = tanhf(x);
    return dy * (1.0f - t * t);
  }
  if constexpr (K == Act::Sigmoid) {
    const float s = sigmoid(x);
    return dy * s * (1.0f - s);
  }
  if constexpr (K == Act::Gelu) {
    const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * expf(-0.5f * x * x);  // exp(-x^2 / 2) / sqrt(2 pi)
    return dy * (cdf + x * pdf);
  }
  if constexpr (K == Act::Silu) {
    const float s = sigmoid(x);
    return dy * s * (1.0f + x * (1.0f - s));
  }
  if constexpr (K == Act::LeakyRelu) return x > 0.0f ? dy : dy * slope;
  return dy;
}

// f(std::integral_constant<Act, K>{}) for the K that is `kind`: the one
// switch from a run-time kind to a kernel instantiated for it (host code).
template <class F>
inline void with_kind(Act kind, F&& f) {
  switch (kind) {
    case Act::Tanh: return f(std::integral_constant<Act, Act::Tanh>{});
    case Act::Sigmoid: return f(std::integral_constant<Act, Act::Sigmoid>{});
    case Act::Gelu: return f(std::integral_constant<Act, Act::Gelu>{});
    case Act::Silu: return f(std::integral_constant<Act, Act::Silu>{});
    case Act::LeakyRelu: return f(std::integral_constant<Act, Act::LeakyRelu>{});
  }
}

}  // namespace fanout::kernels::act
