// Faults and delays the e2e tests inject into dp-train, in one place. They are
// read from FANOUT_TEST_* environment variables only in a build configured
// with -DFANOUT_TEST_HOOKS=ON (test/run_tests.sh turns it on; builds for
// installing leave it off, and then every hook keeps its default). Values are
// parsed strictly: a malformed one is a one-line error.
//
//   FANOUT_TEST_IGNORE_STOP=1        a DDP worker ignores SIGTERM and SIGINT, so
//                                    the launcher's kill after its grace runs
//   FANOUT_TEST_STOP_GRACE_S=S       the launcher's grace before that kill (120)
//   FANOUT_TEST_STEP_SLEEP_S=S       each optimizer step is held S seconds at its
//                                    end, so a signal arrives inside a step
//   FANOUT_TEST_HANG_RANK=R          rank R stops making progress (without
//   FANOUT_TEST_HANG_AT_STEP=N       stopping) once N optimizer steps are done
//   FANOUT_TEST_SKIP_COLLECTIVE=R:T:N  rank R skips its N-th collective of tag T
#pragma once

#include <cstdint>

#include "runtime/distributed/process_group.h"

namespace fanout::apps {

struct TestHooks {
  bool ignore_stop = false;
  double stop_grace_s = 0;  // 0: the launcher's default
  double step_sleep_s = 0;
  int hang_rank = -1;  // -1: no rank hangs
  int64_t hang_at_step = 0;
  distributed::SkippedCollective skip;
};

// The hooks this process was given; parsed once, on the first call.
const TestHooks& test_hooks();

}  // namespace fanout::apps
