// orthopt command-line interface.
#include <c10/util/Exception.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "threads.h"
#include "orthopt/runtime.h"
#include "orthopt/version.h"

namespace {

// Edit distance with transpositions (optimal string alignment), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// The closest of `names` to `word`, or "" when none is close (a typo's distance: at most a third
// of the word, at least 1, at most 3).
std::string closest(const std::string& word, const std::vector<std::string>& names) {
  const size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& n : names) {
    const size_t d = edit_distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best;
}

std::vector<CLI::App*> subcommands_of(CLI::App* app) {
  return app->get_subcommands([](CLI::App*) { return true; });
}

std::vector<std::string> names_of(const std::vector<CLI::App*>& cmds) {
  std::vector<std::string> names;
  for (CLI::App* s : cmds) names.push_back(s->get_name());
  return names;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The subcommand chain named on the command line (the app itself when none), for hints about
// the flags it does not know.
CLI::App* named_command(CLI::App& app, int argc, char** argv) {
  CLI::App* cmd = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok == "--") break;
    for (CLI::App* s : subcommands_of(cmd))
      if (s->get_name() == tok) {
        cmd = s;
        break;
      }
  }
  return cmd;
}

// " (did you mean '--x'?)" for each --flag of argv that `cmd` (and its parents) do not know.
std::string flag_hints(CLI::App* cmd, int argc, char** argv) {
  std::vector<std::string> known;
  for (CLI::App* c = cmd; c != nullptr; c = c->get_parent())
    for (const CLI::Option* o : c->get_options())
      for (const auto& n : o->get_lnames()) known.push_back("--" + n);
  std::string hints;
  for (int i = 1; i < argc; ++i) {
    std::string tok = argv[i];
    if (tok == "--") break;
    if (tok.rfind("--", 0) != 0 || tok.size() < 3) continue;
    tok = tok.substr(0, tok.find('='));
    if (std::find(known.begin(), known.end(), tok) != known.end()) continue;
    const std::string near = closest(tok, known);
    hints += "\northopt: unknown flag '" + tok + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  return hints;
}

}  // namespace

int main(int argc, char** argv) {
  orthopt::init_runtime();
  CLI::App app{"orthopt: Muon-family optimizers, orthogonalization engine and trainer"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("orthopt " ORTHOPT_VERSION_STRING), "print the version and exit");
  orthopt::cli::Action action;
  orthopt::cli::register_bench(app, action);
  orthopt::cli::register_dist(app, action);
  orthopt::cli::register_train(app, action);
  orthopt::cli::register_plan(app, action);
  // Every usage error exits with 2 and names the word it could not use.
  constexpr int kUsageError = 2;
  if (argc >= 2 && argv[1][0] != '-') {
    const std::vector<std::string> commands = names_of(subcommands_of(&app));
    const std::string word = argv[1];
    if (std::find(commands.begin(), commands.end(), word) == commands.end()) {
      const std::string near = closest(word, commands);
      std::cerr << "orthopt: error: unknown command '" << word << "'"
                << (near.empty() ? "" : " (did you mean '" + near + "'?)") << "; commands: " << join(commands)
                << " (orthopt --help)\n";
      return kUsageError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    std::cerr << "orthopt: error: " << e.what() << flag_hints(named_command(app, argc, argv), argc, argv);
    if (dynamic_cast<const CLI::RequiredError*>(&e) && named_command(app, argc, argv) == &app)
      std::cerr << "; commands: " << join(names_of(subcommands_of(&app)));
    std::cerr << "\n";
    return kUsageError;
  }
  try {
    if (action) orthopt::cli::apply_thread_policy();  // threads.h: the CPU threads for the load now
    return action ? action() : 0;
  } catch (const c10::Error& e) {
    std::cerr << "orthopt: error: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "orthopt: error: " << e.what() << "\n";
    return 2;
  }
}
