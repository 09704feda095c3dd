#!/usr/bin/env bash
# The GPU test suite (needs a CUDA GPU and a CUDA torch; not part of CI). From the repository
# root:   ORTHOPT_BUILD_DIR=build-gpu tests/gpu/run.sh
# Builds nothing: run scripts/build.sh first (docs/gpu.md gives the configure arguments).
# Runs: ctest (which includes the gtest GPU suite: tests/gpu/test_gpu_{ortho,graph,fused}.cpp), the
# Python GPU tests, the kernel-level fp64 check, and that check under compute-sanitizer
# memcheck/racecheck.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build-gpu}
status=0
step() { echo "== $*"; "$@" || { echo "!! FAILED: $*"; status=1; }; }
# GPU_SUITE_ONLY=1 skips the CPU-side ctest suite (already run against the same build).
[ -z "${GPU_SUITE_ONLY:-}" ] && step ctest --test-dir "$BUILD_DIR" --output-on-failure -j 4 -E 'test_gpu_ortho|test_gpu_fused'
step "$BUILD_DIR/tests/gpu/test_gpu_ortho"   # directly, so its measured errors are printed
step "$BUILD_DIR/tests/gpu/test_gpu_fused"   # directly: prints the fused-vs-reference differences
step env PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q tests/gpu
step "$BUILD_DIR/gpu/orthopt_kernel_check"
if [ -n "${SKIP_SANITIZER:-}" ]; then
  echo "compute-sanitizer skipped (SKIP_SANITIZER)"
elif command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    step compute-sanitizer --tool "$tool" --error-exitcode 3 "$BUILD_DIR/gpu/orthopt_kernel_check" --quick
  done
else
  echo "!! compute-sanitizer not found"; status=1
fi
echo "GPU suite: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
