// Process runtime: which libstdc++ the library's and the tests' standard-library calls bind to.
// pip's torch 2.x exports a static copy of std::filesystem/<regex> (pytorch/pytorch#133437);
// binding to it crashed every filesystem call on the GPU machine until the build made libstdc++
// the first dependency (CMakeLists.txt). Debian's torch exports none, so here these tests pass
// either way; on a pip-torch machine they fail without the link order.
#include <unistd.h>
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdlib>
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

// Thread defaults: OpenBLAS's pthreads build gets one torch thread (its own pool spins on every
// core), every other BLAS one per core.
TEST(Runtime, DefaultIntraOpThreadsByBlas) {
  EXPECT_EQ(orthopt::default_intra_op_threads(2, "openblas-pthreads"), 1);
  EXPECT_EQ(orthopt::default_intra_op_threads(16, "openblas-pthreads"), 1);
  EXPECT_EQ(orthopt::default_intra_op_threads(2, "openblas-openmp"), 2);
  EXPECT_EQ(orthopt::default_intra_op_threads(16, "other"), 16);
  EXPECT_EQ(orthopt::default_intra_op_threads(4, "openblas-sequential"), 4);
}

// The project's executables run OpenBLAS's OpenMP build whatever the system's alternative (Debian's
// would pick the pthreads build where both are installed); pip's torch brings its own BLAS.
TEST(Runtime, ExecutablesSelectOpenBlasOpenMp) {
  const std::string blas = orthopt::blas_threading();
  if (blas == "other") GTEST_SKIP() << "torch does not run on OpenBLAS here";
  EXPECT_EQ(blas, "openblas-openmp") << "the build's DT_RPATH (ORTHOPT_BLAS_DIR) selects OpenBLAS's OpenMP build";
}

// init_runtime (tests/cpp/main.cpp calls it) applied the default where no variable overrides it.
TEST(Runtime, InitRuntimeAppliedTheDefault) {
  if (orthopt::requested_threads() > 0) GTEST_SKIP() << "thread count set by the environment";
  EXPECT_EQ(at::get_num_threads(),
            orthopt::default_intra_op_threads(orthopt::available_cores(), orthopt::blas_threading()));
}

// The scoped TF32 switch: on, left alone, forbidden; each restores the setting it found.
TEST(Runtime, Tf32ProductsScopes) {
  auto& ctx = at::globalContext();
  const bool before = ctx.allowTF32CuBLAS();
  for (bool start : {false, true}) {
    ctx.setAllowTF32CuBLAS(start);
    {
      const orthopt::Tf32Products on(true);
      EXPECT_TRUE(ctx.allowTF32CuBLAS());
      {
        const auto off = orthopt::Tf32Products::forbidden();
        EXPECT_FALSE(ctx.allowTF32CuBLAS());
      }
      EXPECT_TRUE(ctx.allowTF32CuBLAS());
    }
    EXPECT_EQ(ctx.allowTF32CuBLAS(), start);
    {
      const orthopt::Tf32Products leave(false);
      EXPECT_EQ(ctx.allowTF32CuBLAS(), start);
    }
    EXPECT_EQ(ctx.allowTF32CuBLAS(), start);
  }
  ctx.setAllowTF32CuBLAS(before);
}
