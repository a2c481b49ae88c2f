// Engine helpers shared by the single-device, DataParallel and DDP engines.
#include "runtime/parallel/engine.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/splitmix.h"

namespace fanout {

void apply_split_invariant(Module& model, Device device, const MathOptions& math) {
  if (!math.split_invariant) return;
  FANOUT_USER_CHECK(device.is_cpu()) << "split-invariant math is implemented for CPU devices only, not "
                                     << device.str();
  for (auto& [name, m] : model.named_modules())
    FANOUT_USER_CHECK(!m->normalizes_over_batch())
        << "split-invariant math cannot hold for a model with BatchNorm (" << (name.empty() ? "the model" : name)
        << "): its batch statistics depend on the split by definition";
  model.set_grad_dtype(DType::F64);
}

std::vector<int64_t> replica_arena_bytes(Engine& engine) {
  std::vector<int64_t> out;
  const std::vector<Replica> rs = engine.replicas();
  for (size_t i = 0; i < rs.size(); ++i) {
    const Arenas& a = rs[i].model->arenas();
    const bool shared = i > 0 && rs[i].model->shares_params_with(*rs[0].model);
    out.push_back(static_cast<int64_t>((shared ? 0 : a.params.nbytes()) + a.grads.nbytes() +
                                       (a.buffers.defined() ? a.buffers.nbytes() : 0)) +
                  rs[i].grads_in_flight_bytes);
  }
  return out;
}

int cpu_threads_per_replica(int replicas, const MathOptions& math, int processes) {
  if (math.cpu_threads > 0) return math.cpu_threads;
  if (math.split_invariant) return 1;
  return std::max(1, kernel_thread_budget() / std::max(1, replicas * processes));
}

MathOptions with_cpu_threads(MathOptions math, int replicas, int processes) {
  math.cpu_threads = cpu_threads_per_replica(replicas, math, processes);
  return math;
}

uint64_t pass_key(uint64_t seed, uint64_t pass) { return splitmix64(splitmix64(seed) ^ pass); }

}  // namespace fanout
