#pragma once
// Each subcommand of the orthopt CLI registers itself on the app; main.cpp lists them.
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <functional>
#include <string>

#include "orthopt/execution.h"

namespace orthopt::cli {

// A registered command's action; runs after parsing, returns the process exit code.
using Action = std::function<int()>;

void register_bench(CLI::App& app, Action& action);
void register_dist(CLI::App& app, Action& action);  // launch, dist-step (cli/cmd_dist.cpp)
void register_train(CLI::App& app, Action& action);  // train and compare
void register_plan(CLI::App& app, Action& action);   // plan (bench/bench_step.cpp)

// Checks an --execution value while parsing (a usage error, exit 2, naming the field).
inline CLI::Validator execution_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          (void)parse_execution(value);
          return "";
        } catch (const c10::Error& e) {
          return e.what_without_backtrace();
        }
      },
      "auto|FIELD=VALUE,...");
}

}  // namespace orthopt::cli
