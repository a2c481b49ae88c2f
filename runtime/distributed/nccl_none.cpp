// The NCCL process group in a build without CUDA: refused with one line.
#ifndef FANOUT_WITH_CUDA
#include "runtime/core/error.h"
#include "runtime/distributed/process_group.h"

namespace fanout::distributed {
std::unique_ptr<ProcessGroup> make_nccl_group(const GroupOptions&, Device) {
  FANOUT_FAIL() << "the NCCL process group needs CUDA devices and a CUDA build";
}
}  // namespace fanout::distributed
#endif
