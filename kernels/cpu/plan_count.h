// How many oneDNN plans (a shape's primitives, kernels/cpu/onednn.h) this
// process has made on every context: tests prove that a warmed-up training
// step makes none. Kept apart from onednn.h so that callers need no oneDNN
// headers.
#pragma once
#include <cstdint>

namespace fanout::kernels::cpu {

uint64_t onednn_plans_made();

}  // namespace fanout::kernels::cpu
