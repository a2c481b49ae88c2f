// oneDNN state per context, threads, memory binding and execution.
#include "kernels/cpu/onednn.h"

#include <omp.h>

#include <atomic>
#include <mutex>

#include "runtime/core/device.h"
#include "runtime/core/error.h"

namespace fanout::kernels::cpu::onednn {

Key& Key::operator<<(int64_t x) {
  FANOUT_CHECK(n < static_cast<int>(v.size())) << "oneDNN plan key longer than " << v.size();
  v[n++] = x;
  return *this;
}

size_t KeyHash::operator()(const Key& k) const {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.v[i])) * 1099511628211ull;
  return static_cast<size_t>(h);
}

namespace {
std::atomic<uint64_t> plans_made{0};
}

State::State() : engine(dnnl::engine::kind::cpu, 0), stream(engine) {
  // Plans are kept per context: oneDNN's process-wide primitive cache would
  // only hold them twice, and share them between device workers.
  static std::once_flag once;
  std::call_once(once, [] { dnnl::set_primitive_cache_capacity(0); });
}

void State::count_plan() { plans_made.fetch_add(1, std::memory_order_relaxed); }

State& state(Context& ctx) {
  // OpenMP's thread count is the calling thread's own setting: the device
  // worker that runs this context keeps its share of the cores.
  const int t = onednn_threads(ctx);
  if (omp_get_max_threads() != t) omp_set_num_threads(t);
  if (!ctx.backend_state()) ctx.set_backend_state(std::make_unique<State>());
  return static_cast<State&>(*ctx.backend_state());
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

dnnl::memory::desc plain(const dnnl::memory::dims& dims) {
  using tag = dnnl::memory::format_tag;
  tag t = tag::undef;
  switch (dims.size()) {
    case 1: t = tag::a; break;
    case 2: t = tag::ab; break;
    case 3: t = tag::abc; break;
    case 4: t = tag::abcd; break;
    case 5: t = tag::abcde; break;
    default: FANOUT_FAIL() << "oneDNN: no plain layout for " << dims.size() << " dims";
  }
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, t);
}

dnnl::memory unbound(const dnnl::memory::desc& md, const dnnl::engine& e) {
  return dnnl::memory(md, e, DNNL_MEMORY_NONE);
}

void bind(const dnnl::memory& m, const void* data) {
#if FANOUT_DNNL3
  FANOUT_CHECK(dnnl_memory_set_data_handle(m.get(), const_cast<void*>(data)) == dnnl_success)
#else
  FANOUT_CHECK(dnnl_memory_set_data_handle_v2(m.get(), const_cast<void*>(data), nullptr) == dnnl_success)
#endif
      << "oneDNN: cannot bind memory";
}

void execute(State& s, const dnnl::primitive& p, std::initializer_list<std::pair<int, const dnnl::memory*>> args) {
  dnnl_exec_arg_t a[12];
  int n = 0;
  for (const auto& [arg, m] : args) {
    FANOUT_CHECK(n < 12) << "oneDNN: too many arguments";
    a[n++] = {arg, m->get()};
  }
  const dnnl_status_t st = dnnl_primitive_execute(p.get(), s.stream.get(), n, a);
  FANOUT_USER_CHECK(st != dnnl_out_of_memory) << "out of host memory in a oneDNN kernel (a model or batch too large?)";
  FANOUT_CHECK(st == dnnl_success) << "oneDNN: primitive execution failed (status " << static_cast<int>(st) << ")";
  FANOUT_CHECK(dnnl_stream_wait(s.stream.get()) == dnnl_success) << "oneDNN: stream wait failed";
}

}  // namespace fanout::kernels::cpu::onednn

namespace fanout::kernels::cpu {
uint64_t onednn_plans_made() { return onednn::plans_made.load(std::memory_order_relaxed); }
}  // namespace fanout::kernels::cpu
