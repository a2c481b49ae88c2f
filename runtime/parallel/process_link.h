// A process group as the primary replica uses it: collectives on tensors in
// the primary's memory, staged through the memory the group's backend takes
// (host for Gloo, the GPU for NCCL) when that differs. DDP and the hybrid
// hold one (in their Reducer); Engine::process_link() hands it to the
// training loop for its sums and barriers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/distributed/process_group.h"

namespace fanout {

// Gloo tags: the global stage's thread and the caller's thread each run
// their collectives in program order, and the two may overlap.
inline constexpr uint32_t kTagMain = 1, kTagGrads = 2;

class ProcessLink {
 public:
  ProcessLink(std::shared_ptr<distributed::ProcessGroup> group, Context& primary);
  distributed::ProcessGroup& group() { return *group_; }
  const distributed::ProcessGroup& group() const { return *group_; }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  // Whether the group takes host tensors.
  bool host() const { return host_; }
  // Whether t goes to the group as it is (else through a staging buffer).
  bool direct(const Tensor& t) const { return host_ ? t.device().is_cpu() : t.device() == ctx_.device(); }
  // `wire` BF16: an F32 t travels and is summed as bfloat16 (rounded to it
  // and back; the rounding is the conversion); otherwise t goes as it is.
  void all_reduce(Tensor& t, const std::string& what, uint32_t tag, DType wire = DType::F32);
  void broadcast(Tensor& t, const std::string& what, uint32_t tag, int root = 0);
  // Rank root's t becomes the sum; the others' t is left undefined.
  void reduce(Tensor& t, int root, const std::string& what, uint32_t tag, DType wire = DType::F32);
  // out (size() * in.numel()) receives every rank's in; small host tensors (start-up checks).
  void all_gather_host(const Tensor& in, Tensor& out, const std::string& what, uint32_t tag);
  // Host-side sums on the caller's tag: `v` over every process, in place
  // (`what` names it in errors: "epoch statistics", "the stop check").
  void all_reduce_counts(std::vector<int64_t>& v, const std::string& what);
  double sum(double v, const std::string& what);
  void barrier(const std::string& what) { group_->barrier(what, kTagMain); }

 private:
  void staged(Tensor& t, Tensor& staging, const std::function<void(Tensor&)>& collective);
  void in_wire_type(Tensor& t, DType wire, const std::function<void(Tensor&)>& collective);
  std::shared_ptr<distributed::ProcessGroup> group_;
  Context& ctx_;
  bool host_;
  Tensor staging_;
  Tensor low_, low_staging_;  // gradient sums in a lower wire type (the global stage's alone)
  Tensor away_;               // a lower-type sum's float32 copy from another replica's device
  Tensor counts_, scalar_;    // all_reduce_counts' and sum's host buffers
};

}  // namespace fanout
