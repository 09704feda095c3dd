// orthopt command-line interface.
#include <c10/util/Exception.h>

#include <iostream>

#include "commands.h"
#include "orthopt/runtime.h"

int main(int argc, char** argv) {
  orthopt::init_runtime();
  CLI::App app{"orthopt: Muon-family optimizers, orthogonalization engine and trainer"};
  app.require_subcommand(1);
  orthopt::cli::Action action;
  orthopt::cli::register_bench(app, action);
  orthopt::cli::register_dist(app, action);
  orthopt::cli::register_train(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action ? action() : 0;
  } catch (const c10::Error& e) {
    std::cerr << "orthopt: error: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "orthopt: error: " << e.what() << "\n";
    return 2;
  }
}
