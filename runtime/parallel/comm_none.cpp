// CUDA communicators in a build without CUDA: refused with one line.
#ifndef FANOUT_WITH_CUDA
#include "runtime/core/error.h"
#include "runtime/parallel/comm.h"

namespace fanout {
std::unique_ptr<Comm> make_p2p_comm(const std::vector<Device>&, int) {
  FANOUT_FAIL() << "the p2p communicator needs CUDA devices and a CUDA build";
}
std::unique_ptr<Comm> make_nccl_comm(const std::vector<Device>&, int) {
  FANOUT_FAIL() << "the NCCL communicator needs CUDA devices and a CUDA build";
}
}  // namespace fanout
#endif
