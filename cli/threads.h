#pragma once
// The CLI's CPU thread policy (docs/training.md, "CPU threads"). The library changes no global
// setting; the program does, at start:
// - OpenMP waits passively: where neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, the program
//   re-executes itself with OMP_WAIT_POLICY=PASSIVE before any library initializer runs (libgomp
//   reads its environment once, when it is loaded, before main). Threads that spin at a barrier
//   take the cores the working threads and other programs need.
// - torch's intra-op threads: ORTHOPT_NUM_THREADS or OMP_NUM_THREADS where set; else the runtime's
//   default (init_runtime) less the cores other programs keep busy, at least 1.
#include <string>

namespace orthopt::cli {

// The threads for a machine of `cores` cores of which other programs keep `busy` busy:
// clamp(base − round(busy), 1, base), with base the runtime's default for `cores`.
int threads_under_load(int base, double busy);

// Cores other programs keep busy now: the share of non-idle time over all CPUs in /proc/stat,
// sampled over 200 ms while this process sleeps, times this process's cores. Tests set
// ORTHOPT_TEST_BUSY_CORES to a number instead. Negative when it cannot be read.
double busy_cores_of_others();

struct ThreadChoice {
  int threads = 0;          // torch's intra-op threads now
  double busy = -1.0;       // the busy cores measured (-1: not measured)
  std::string reason;       // how the number was chosen, one line
  std::string wait_policy;  // OMP_WAIT_POLICY as libgomp read it ("" when unset)
};

// Sets torch's intra-op threads by the policy above (once a command is about to run; --help and
// usage errors skip the 200 ms measurement) and returns the choice. Idempotent.
const ThreadChoice& apply_thread_policy();

}  // namespace orthopt::cli
