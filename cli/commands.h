#pragma once
// Each subcommand of the orthopt CLI registers itself on the app; main.cpp lists them.
#include <CLI/CLI.hpp>

#include <functional>

namespace orthopt::cli {

// A registered command's action; runs after parsing, returns the process exit code.
using Action = std::function<int()>;

void register_bench(CLI::App& app, Action& action);
void register_dist(CLI::App& app, Action& action);  // launch, dist-step (cli/cmd_dist.cpp)
void register_train(CLI::App& app, Action& action);  // train and compare

}  // namespace orthopt::cli
