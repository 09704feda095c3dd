#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest + pytest), then
# the package checks (scripts/test_install.sh: pip install, the installed CMake package, the BLAS).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}
# ctest runs one test per core; each test then uses one thread (two 2-thread torch pools
# on 2 cores spin against each other and run tiny tensors ~50x slower).
ORTHOPT_NUM_THREADS=${ORTHOPT_NUM_THREADS:-1} ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
PY=$(grep -E '^Python3_EXECUTABLE' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2)
. scripts/blas_env.sh
PYTHONPATH="$BUILD_DIR/python" with_openmp_blas "$PY" -m pytest -q tests/python
ORTHOPT_BUILD_DIR="$BUILD_DIR" ORTHOPT_PYTHON="$PY" scripts/test_install.sh
