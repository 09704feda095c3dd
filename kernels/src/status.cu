#include "orthopt_kernels.h"

static thread_local const char* g_last_error = "";

extern "C" const char* orthopt_last_error(void) { return g_last_error; }
