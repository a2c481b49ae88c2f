// The rendezvous store behind a process group (internal: included by the
// Gloo and NCCL groups only). Keys are prefixed with the run id; every wait
// (including Gloo's own, which would use its 30 s default) lasts timeout_s.
#pragma once
#include <memory>
#include <string>

#include <gloo/rendezvous/store.h>

#include "runtime/distributed/process_group.h"

namespace fanout::distributed {

std::shared_ptr<gloo::rendezvous::Store> open_store(const Rendezvous& r, const std::string& run_id,
                                                    double timeout_s);

// First line of an exception message from Gloo (its messages carry source paths and stack text).
std::string first_line(const std::string& s);

}  // namespace fanout::distributed
