// Parameter initialization from a seeded generator.
#include "models/layers/init.h"

#include "runtime/core/error.h"

namespace fanout::models {

void uniform_fill(Tensor& t, float bound, std::mt19937_64& rng) {
  FANOUT_CHECK(t.device().is_cpu()) << "initialization runs on the CPU";
  std::uniform_real_distribution<float> u(-bound, bound);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
}

void normal_fill(Tensor& t, float stddev, std::mt19937_64& rng) {
  FANOUT_CHECK(t.device().is_cpu()) << "initialization runs on the CPU";
  std::normal_distribution<float> n(0.0f, stddev);
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = n(rng);
}

}  // namespace fanout::models
