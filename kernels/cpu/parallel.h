// Threads for the CPU kernels: a call on a context may use
// Context::math.cpu_threads threads (kernel_thread_budget() when 0: every
// core, or OMP_NUM_THREADS), the calling thread
// and an OpenMP team it owns (each device worker has its own). Work is cut
// into contiguous ranges, one per thread, each computed exactly as a
// one-thread call computes it: results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>

#include <omp.h>

#include "runtime/core/context.h"
#include "runtime/core/device.h"

namespace fanout::kernels::cpu {

// The threads a kernel call on this context may use. The ThreadSanitizer
// build uses one: GCC's OpenMP runtime is not built with TSan, which would
// report every hand-off across its barriers; fanout's own threads (device
// workers, loader, communication) stay checked.
inline int threads(const Context& ctx) {
#ifdef FANOUT_ONE_KERNEL_THREAD
  return 1;
#else
  return ctx.math.cpu_threads > 0 ? ctx.math.cpu_threads : kernel_thread_budget();
#endif
}

// Items per range so that a range holds at least ~16 Ki elements of work
// (a thread's wake-up costs microseconds).
inline int64_t grain_for(int64_t elements_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, elements_per_item));
}

// f(begin, end) over [0, n) in one contiguous range per thread; ranges hold
// at least `grain` items (fewer threads for small n; inline for one). An
// exception thrown by f is rethrown on the calling thread.
template <class F>
void parallel_for(const Context& ctx, int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  const int t = static_cast<int>(std::clamp<int64_t>(n / std::max<int64_t>(1, grain), 1, threads(ctx)));
  if (t == 1) {
    f(int64_t{0}, n);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel num_threads(t)
  {
    const int64_t i = omp_get_thread_num(), k = omp_get_num_threads();
    const int64_t begin = n * i / k, end = n * (i + 1) / k;
    try {
      if (end > begin) f(begin, end);
    } catch (...) {
#pragma omp critical(fanout_parallel_for_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fanout::kernels::cpu
