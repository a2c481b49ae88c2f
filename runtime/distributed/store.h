// The rendezvous store behind a process group and the network helpers around
// it (internal: included by the Gloo and NCCL groups only). Keys are
// prefixed with the run id; every wait (including Gloo's own, which would use
// its 30 s default) lasts timeout_s. A Redis store authenticates with the
// rendezvous's password first.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/distributed/process_group.h"

namespace fanout::distributed {

std::shared_ptr<gloo::rendezvous::Store> open_store(const Rendezvous& r, const std::string& run_id,
                                                    double timeout_s);

// The keys of `keys` not set in a store open_store made (none for another store).
std::vector<std::string> missing_keys(gloo::rendezvous::Store& store, const std::vector<std::string>& keys);

// Deletes keys of a finished rendezvous from the store, Redis's or the
// file store's (best effort: a key left behind makes a later run with the
// same id fail with a line that says so).
void forget_keys(const Rendezvous& r, const std::string& run_id, const std::vector<std::string>& keys);

// The IPv4 address of network interface `ifname`; a one-line error when it
// does not exist or has none.
std::string interface_address(const std::string& ifname);

// The source address this machine uses to reach host:port (its route), or ""
// when the host does not resolve or no route leads there.
std::string route_address(const std::string& host, int port);

// Whether each IPv4 host answers a TCP connection attempt (a refusal counts:
// the machine is there) within timeout_s, all at once: per host "answers",
// "no answer" or the error (e.g. "Network is unreachable").
std::vector<std::pair<std::string, std::string>> probe_hosts(const std::vector<std::string>& hosts, double timeout_s);

// First line of an exception message from Gloo (its messages carry source paths and stack text).
std::string first_line(const std::string& s);

}  // namespace fanout::distributed
