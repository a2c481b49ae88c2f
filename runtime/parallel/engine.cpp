// Engine helpers shared by the single-device, DataParallel and DDP engines.
#include "runtime/parallel/engine.h"

#include <algorithm>

#include "runtime/core/error.h"
#include "runtime/core/splitmix.h"

namespace fanout {

void check_batch_given(const Tensor& x, const Tensor& y) {
  FANOUT_USER_CHECK(x.defined()) << "the batch's input is an undefined tensor (Tensor())";
  FANOUT_USER_CHECK(y.defined()) << "the batch's targets are an undefined tensor (Tensor())";
  FANOUT_USER_CHECK(x.dim() >= 1 && x.size(0) >= 1) << "forward needs a non-empty batch, got " << x.shape().str();
}

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

std::vector<ReplicaArenas> replica_arenas(Engine& engine) {
  std::vector<ReplicaArenas> out;
  const std::vector<Replica> rs = engine.replicas();
  for (size_t i = 0; i < rs.size(); ++i) {
    const Arenas& a = rs[i].model->arenas();
    const bool shared = i > 0 && rs[i].model->shares_params_with(*rs[0].model);
    ReplicaArenas r;
    r.params = shared ? 0 : static_cast<int64_t>(a.params.nbytes());
    r.grads = static_cast<int64_t>(a.grads.nbytes()) + rs[i].grads_in_flight_bytes;
    r.buffers = a.buffers.defined() ? static_cast<int64_t>(a.buffers.nbytes()) : 0;
    out.push_back(r);
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

GraphStats Engine::graph_stats() const {
  GraphStats s;
  s.off_reason = "this engine does not capture CUDA graphs";
  return s;
}

}  // namespace fanout
