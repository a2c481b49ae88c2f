// Threads for the CPU kernels: a call on a context may use
// Context::math.cpu_threads threads (kernel_thread_budget() when 0: every
// core, or OMP_NUM_THREADS): the calling thread and an OpenMP team it owns
// (each device worker has its own), or, on a context with cpu_workers
// (DataParallel's optimizer step), those threads, each with its own team.
// Work is cut into contiguous ranges, each computed exactly as a one-thread
// call computes it: results do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <omp.h>

#include "runtime/core/context.h"
#include "runtime/core/device.h"

namespace fanout::kernels::cpu {

// The threads a kernel call on this context may use.
inline int threads(const Context& ctx) {
  return ctx.math.cpu_threads > 0 ? ctx.math.cpu_threads : kernel_thread_budget();
}

// oneDNN's OpenMP team for a call on this context. The ThreadSanitizer build
// (FANOUT_TSAN) gives it one thread: GCC's OpenMP runtime and oneDNN are not
// built with TSan, which would report every hand-off across their barriers.
// fanout's own loops (parallel_for) keep their threads there, on std::threads
// that TSan sees.
inline int onednn_threads(const Context& ctx) {
#ifdef FANOUT_TSAN
  return 1;
#else
  return threads(ctx);
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
  std::mutex error_mu;
  auto range = [&](int64_t i, int64_t k) {
    const int64_t begin = n * i / k, end = n * (i + 1) / k;
    try {
      if (end > begin) f(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> g(error_mu);
      if (!error) error = std::current_exception();
    }
  };
  // Ranges [first, first + count) of t on the calling thread and a team of its own, every range run
  // however many threads OpenMP gives (OMP_THREAD_LIMIT, OMP_DYNAMIC, a nested region).
  const auto run_ranges = [&](int first, int count) {
    if (count <= 0) return;
#ifdef FANOUT_TSAN
    std::vector<std::jthread> team;
    for (int i = 1; i < count; ++i) team.emplace_back([&, i] { range(first + i, t); });
    range(first, t);
#else
#pragma omp parallel num_threads(count)
    for (int i = omp_get_thread_num(); i < count; i += omp_get_num_threads()) range(first + i, t);
#endif
  };
  if (ctx.cpu_workers && ctx.cpu_worker_count > 1) {
    // Worker k takes its share of the t ranges. One pointer captured: the std::function the hook takes
    // holds it in place (no allocation).
    struct Share {
      const decltype(run_ranges)& run;
      int t, w;
    } share{run_ranges, t, ctx.cpu_worker_count};
    ctx.cpu_workers([s = &share](int k) { s->run(s->t * k / s->w, s->t * (k + 1) / s->w - s->t * k / s->w); });
  } else {
    run_ranges(0, t);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fanout::kernels::cpu
