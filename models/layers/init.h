// Parameter initialization shared by the layers: seeded, on the CPU (models
// are initialized on the CPU, then moved).
#pragma once
#include <random>

#include "runtime/core/tensor.h"

namespace fanout::models {

// Fills with U(-bound, bound).
void uniform_fill(Tensor& t, float bound, std::mt19937_64& rng);
// Fills with N(0, stddev^2).
void normal_fill(Tensor& t, float stddev, std::mt19937_64& rng);

}  // namespace fanout::models
