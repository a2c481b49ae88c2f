// splitmix64's finalizer: the one integer hash for seeds and counter-based
// draws (data augmentation, Dropout masks, pass keys), on host and device.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define FANOUT_SPLITMIX_HD __host__ __device__ __forceinline__
#else
#define FANOUT_SPLITMIX_HD inline
#endif

namespace fanout {

FANOUT_SPLITMIX_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace fanout
