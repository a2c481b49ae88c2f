// ProcessLink: a process group's collectives on the primary's tensors.
#include "runtime/parallel/process_link.h"

#include <algorithm>

#include "kernels/convert.h"
#include "runtime/core/error.h"

namespace fanout {

ProcessLink::ProcessLink(std::shared_ptr<distributed::ProcessGroup> group, Context& primary)
    : group_(std::move(group)), ctx_(primary), host_(group_->host_memory()) {}

void ProcessLink::staged(Tensor& t, Tensor& staging, const std::function<void(Tensor&)>& collective) {
  if (direct(t)) {
    // The group runs on its own stream: what the compute stream still writes into t comes first.
    if (!host_) ctx_.compute().synchronize();
    return collective(t);
  }
  ensure(staging, t.shape(), t.dtype(), host_ ? Device::cpu() : ctx_.device());
  Tensor s = staging.flat(0, t.shape());
  s.copy_from(t, &ctx_.compute());
  ctx_.compute().synchronize();
  collective(s);
  t.copy_from(s, &ctx_.compute());
  ctx_.compute().synchronize();
}

void ProcessLink::in_wire_type(Tensor& t, DType wire, const std::function<void(Tensor&)>& collective) {
  if (wire != DType::BF16) return staged(t, staging_, collective);
  FANOUT_CHECK(t.dtype() == DType::F32) << "a " << dtype_name(t.dtype()) << " sum cannot travel as bfloat16";
  if (t.device() != ctx_.device()) {
    // A shard owned by another replica's device: converted through a copy on
    // the primary's, so every process sends the piece in the same wire type.
    ensure(away_, t.shape(), t.dtype(), ctx_.device());
    Tensor a = away_.flat(0, t.shape());
    a.copy_from(t, &ctx_.compute());
    in_wire_type(a, wire, collective);
    t.copy_from(a, &ctx_.compute());
    ctx_.compute().synchronize();
    return;
  }
  // Converted on the primary, so a GPU's bucket crosses to the host (Gloo) at the wire type's size.
  ensure(low_, t.shape(), wire, t.device());
  Tensor l = low_.flat(0, t.shape());
  kernels::convert(ctx_, t, l);
  staged(l, low_staging_, collective);
  kernels::convert(ctx_, l, t);
}

void ProcessLink::all_reduce(Tensor& t, const std::string& what, uint32_t tag, DType wire) {
  in_wire_type(t, wire, [&](Tensor& s) { group_->all_reduce(s, what, tag); });
}

void ProcessLink::broadcast(Tensor& t, const std::string& what, uint32_t tag, int root) {
  staged(t, staging_, [&](Tensor& s) { group_->broadcast(s, root, what, tag); });
}

void ProcessLink::all_gather_host(const Tensor& in, Tensor& out, const std::string& what, uint32_t tag) {
  if (host_) return group_->all_gather(in, out, what, tag);
  const Tensor din = in.to(ctx_.device());  // once, at start-up: allocating is fine
  Tensor dout = Tensor::empty(out.shape(), out.dtype(), ctx_.device());
  group_->all_gather(din, dout, what, tag);
  out.copy_from(dout);
}

void ProcessLink::reduce(Tensor& t, int root, const std::string& what, uint32_t tag, DType wire) {
  in_wire_type(t, wire, [&](Tensor& s) { group_->reduce(s, root, what, tag); });
}

void ProcessLink::all_reduce_counts(std::vector<int64_t>& v, const std::string& what) {
  ensure(counts_, Shape{static_cast<int64_t>(v.size())}, DType::I64, Device::cpu());
  Tensor t = counts_.flat(0, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  all_reduce(t, "all-reduce of " + what, kTagMain);
  std::copy(t.data<int64_t>(), t.data<int64_t>() + v.size(), v.begin());
}

double ProcessLink::sum(double v, const std::string& what) {
  ensure(scalar_, Shape{1}, DType::F64, Device::cpu());
  scalar_.f64()[0] = v;
  all_reduce(scalar_, "all-reduce of " + what, kTagMain);
  return scalar_.f64()[0];
}

}  // namespace fanout
