// One declaration point per op family for every backend (Caffe declares
// Forward_cpu and Forward_gpu side by side; here one list serves all three).
// A family's header wraps its ops in FANOUT_KERNEL_OPS(...), which declares
// each of them as
//   kernels::op        the public entry point: checks, then FANOUT_DISPATCH
//                      (kernels/dispatch.h) to the context's device;
//   kernels::cpu::op   the CPU backend, kernels/cpu/<family>.cpp;
//   kernels::cuda::op  the CUDA backend, kernels/cuda/<family>.cu (defined in
//                      CUDA builds only; a CPU-only build never names it).
// Backends are called after the entry point's checks and may rely on them.
#pragma once

#define FANOUT_KERNEL_OPS(...) \
  __VA_ARGS__                  \
  namespace cpu {              \
  __VA_ARGS__                  \
  }                            \
  namespace cuda {             \
  __VA_ARGS__                  \
  }
