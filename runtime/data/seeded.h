// Seeded randomness the data pipeline shares: splitmix64 (stream seeds and
// per-sample hashes) and uniform [0, 1) from raw mt19937_64 output. Only raw
// engine output is used (the standard fixes it exactly; its distributions it
// does not), so a seed gives the same bytes with every standard library.
#pragma once
#include <cstdint>
#include <random>

#include "runtime/core/splitmix.h"

namespace fanout::data {

using fanout::splitmix64;

// Uniform [0, 1) from the top 53 bits.
inline double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace fanout::data
