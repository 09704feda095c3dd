#pragma once
// orthopt bench step: whole optimizer step timings on performance.md's parameter sets.
#include "commands.h"

namespace orthopt::cli {

// Adds `step` under the `bench` subcommand.
void register_bench_step(CLI::App& bench, Action& action);


}  // namespace orthopt::cli
