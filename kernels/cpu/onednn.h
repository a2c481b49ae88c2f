// oneDNN under the CPU backend: each context's engine, stream and cache of
// primitives (made once per shape, kept for the context's life), the
// calling thread's OpenMP team sized to the context's share of the cores,
// scratch memory from the context's workspace, and execution without
// allocation on our side. The convolution and GEMM kernels build on it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>

// oneDNN 3 made primitive descriptors without operation descriptors
// (make_pd below) and dropped output scales; both APIs build.
#define FANOUT_DNNL3 (DNNL_VERSION_MAJOR >= 3)

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/plan_count.h"
#include "runtime/core/context.h"

namespace fanout::kernels::cpu::onednn {

using cpu::threads;

// The ops with plans: a key's first number.
enum PlanKind : int64_t {
  kConvForward = 1, kConvBackwardData, kConvBackwardWeights, kGemm, kGemmStridedBatched, kGemmLow,
  kConvLowForward, kConvLowBackwardData, kConvLowBackwardWeights
};

// What identifies a cached plan: its kind, then every number its primitives
// were made for (shapes, geometry, which outputs, threads).
struct Key {
  std::array<int64_t, 28> v{};
  int n = 0;
  Key& operator<<(int64_t x);
  bool operator==(const Key& o) const { return n == o.n && v == o.v; }
};
struct KeyHash {
  size_t operator()(const Key& k) const;
};

// A cached set of primitives and the memory objects they run on.
struct Plan {
  virtual ~Plan() = default;
};

class State : public BackendState {
 public:
  State();
  dnnl::engine engine;
  dnnl::stream stream;
  // The plan for `key`, made by make() (returning std::unique_ptr<P>) on the first request.
  template <class P, class Make>
  P& plan(const Key& key, Make&& make) {
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      it = plans_.emplace(key, make()).first;
      count_plan();
    }
    return static_cast<P&>(*it->second);
  }

 private:
  static void count_plan();  // onednn_plans_made()
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

// The context's oneDNN state (made on first use), with the calling thread's
// OpenMP team set to onednn_threads(ctx). Call before making or running primitives.
State& state(Context& ctx);

// Primitive attributes every plan uses: scratchpads passed in by the caller.
dnnl::primitive_attr user_scratchpad();

// Primitive P's descriptor for the operation's arguments `a` (in oneDNN's
// order) and attributes, in either API: oneDNN 2 goes through an operation
// descriptor, oneDNN 3 takes the arguments directly.
template <class P, class... A>
typename P::primitive_desc make_pd(const dnnl::engine& e, const dnnl::primitive_attr& attr, A&&... a) {
#if FANOUT_DNNL3
  return typename P::primitive_desc(e, std::forward<A>(a)..., attr);
#else
  return typename P::primitive_desc(typename P::desc(std::forward<A>(a)...), attr, e);
#endif
}
// The same for a backward pass, with its forward pass's descriptor as hint.
template <class P, class Hint, class... A>
typename P::primitive_desc make_backward_pd(const dnnl::engine& e, const dnnl::primitive_attr& attr, const Hint& hint,
                                            A&&... a) {
#if FANOUT_DNNL3
  return typename P::primitive_desc(e, std::forward<A>(a)..., hint, attr);
#else
  return typename P::primitive_desc(typename P::desc(std::forward<A>(a)...), attr, e, hint);
#endif
}

// Memory descriptor of a plain row-major float tensor of these dims
// (nc, nchw, ncdhw, oihw, ... by rank).
dnnl::memory::desc plain(const dnnl::memory::dims& dims);

// A memory object with no data yet; bind() points it at the data of one call.
dnnl::memory unbound(const dnnl::memory::desc& md, const dnnl::engine& e);
void bind(const dnnl::memory& m, const void* data);

// Runs p with these (DNNL_ARG_*, memory) pairs and waits for it.
void execute(State& s, const dnnl::primitive& p, std::initializer_list<std::pair<int, const dnnl::memory*>> args);

// Where a plan's scratch buffers lie in the context's workspace: add() each
// size once when the plan is made (64-byte aligned offsets); each call then
// asks the workspace for `bytes` and offsets from its start.
struct WorkspaceLayout {
  size_t bytes = 0;
  size_t add(size_t n) {
    const size_t at = bytes;
    bytes += (n + 63) / 64 * 64;
    return at;
  }
};

}  // namespace fanout::kernels::cpu::onednn
