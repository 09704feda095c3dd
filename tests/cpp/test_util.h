#pragma once
// Small helpers shared by the C++ tests.
#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace orthopt::test {

// The message of the c10::Error that `f` throws (without backtrace), or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// The orthopt binary under test (ctest sets ORTHOPT_BIN).
inline std::string orthopt_bin() {
  const char* b = std::getenv("ORTHOPT_BIN");
  return b ? b : "build/orthopt";
}

// A fresh scratch directory <tmp>/<prefix>_<pid>, created once per process (one prefix per binary).
inline std::filesystem::path scratch_root(const std::string& prefix) {
  static const std::filesystem::path root = [&] {
    auto p = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p;
  }();
  return root;
}

// The whole content of a file ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace orthopt::test
