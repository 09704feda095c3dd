#include <cstdarg>
#include <cstdio>

#include "internal.h"

namespace {
thread_local char g_last_error[512] = "";
}

extern "C" const char* orthopt_last_error(void) { return g_last_error; }

namespace orthopt_k {

orthopt_status fail(orthopt_status code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return code;
}

}  // namespace orthopt_k
