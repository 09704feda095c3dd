#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test (ctest + pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
PY=$(grep -E '^Python3_EXECUTABLE' "$BUILD_DIR/CMakeCache.txt" | cut -d= -f2)
PYTHONPATH="$BUILD_DIR/python" "$PY" -m pytest -q tests/python
