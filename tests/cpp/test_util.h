#pragma once
// Small helpers shared by the C++ tests.
#include <c10/util/Exception.h>

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

}  // namespace orthopt::test
