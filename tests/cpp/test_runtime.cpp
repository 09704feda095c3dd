// Process runtime: which libstdc++ the library's and the tests' standard-library calls bind to.
// pip's torch 2.x exports a static copy of std::filesystem/<regex> (pytorch/pytorch#133437);
// binding to it crashed every filesystem call on the GPU machine until the build made libstdc++
// the first dependency (CMakeLists.txt). Debian's torch exports none, so here these tests pass
// either way; on a pip-torch machine they fail without the link order.
#include <unistd.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "orthopt/runtime.h"

TEST(Runtime, LibraryFilesystemCallsBindToSystemLibstdcxx) {
  const std::string lib = orthopt::filesystem_provider();
  EXPECT_NE(lib.find("libstdc++"), std::string::npos) << "liborthopt's std::filesystem binds to " << lib;
}

TEST(Runtime, ExecutableFilesystemCallsBindToSystemLibstdcxx) {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&);
  RemoveAll fn = &std::filesystem::remove_all;
  const std::string lib = orthopt::shared_object_of(reinterpret_cast<const void*>(fn));
  EXPECT_NE(lib.find("libstdc++"), std::string::npos) << "the test's std::filesystem binds to " << lib;
}

TEST(Runtime, FilesystemCallsWork) {
  // The calls that crashed under the wrong binding (remove_all on a missing and a filled tree).
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("orthopt_test_runtime_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "a" / "b");
  EXPECT_TRUE(fs::is_directory(dir / "a" / "b"));
  EXPECT_EQ(fs::remove_all(dir), 3u);
  EXPECT_FALSE(fs::exists(dir));
}

TEST(Runtime, AvailableCoresIsPositive) { EXPECT_GE(orthopt::available_cores(), 1); }
