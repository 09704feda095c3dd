#!/usr/bin/env bash
# The GPU test suite (needs a CUDA GPU and a CUDA torch; not part of CI). From the repository
# root:   ORTHOPT_BUILD_DIR=build-gpu tests/gpu/run.sh
# Builds nothing: run scripts/build.sh first (docs/gpu.md gives the configure arguments).
# Runs: ctest (which includes the gtest GPU suite: tests/gpu/test_gpu_{ortho,graph,fused}.cpp), the
# Python GPU tests, the kernel-level fp64 check, and that check (and the one-pass momentum and
# NS input's test) under compute-sanitizer memcheck/racecheck.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build-gpu}
# The suite in parts, for machines lent one call of at most 10 minutes at a time (the whole of it,
# racecheck over the full list included, runs longer):
#   GPU_SUITE_STEPS="ctest gtest pytest kernel_check sanitizer"   which parts (default: all);
#   GPU_SUITE_ONLY=1      leaves out ctest (the CPU suite, already run against the same build);
#   SKIP_SANITIZER=1      leaves out the sanitizer runs;
#   SANITIZER_TOOLS="memcheck racecheck"   which compute-sanitizer tools (default: both);
#   SANITIZER_SYM_PATHS="persistent ..."   one run per tool and symmetric-product path (blocks,
#     dense, persistent, auto: kernel_check --quick with KERNEL_CHECK_SYM_PATH; its other checks
#     run in each), instead of one over every path, so that each run is short and its reports
#     name one kernel.
STEPS=${GPU_SUITE_STEPS:-ctest gtest pytest kernel_check sanitizer}
[ -n "${GPU_SUITE_ONLY:-}" ] && STEPS=${STEPS//ctest/}
[ -n "${SKIP_SANITIZER:-}" ] && { STEPS=${STEPS//sanitizer/}; echo "compute-sanitizer skipped (SKIP_SANITIZER)"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
status=0
step() { echo "== $*"; "$@" || { echo "!! FAILED: $*"; status=1; }; }
want ctest && step ctest --test-dir "$BUILD_DIR" --output-on-failure -j 4 -E 'test_gpu_ortho|test_gpu_fused'
if want gtest; then
  step "$BUILD_DIR/tests/gpu/test_gpu_ortho"   # directly, so its measured errors are printed
  step "$BUILD_DIR/tests/gpu/test_gpu_fused"   # directly: prints the fused-vs-reference differences
fi
want pytest && step env PYTHONPATH="$BUILD_DIR/python" python3 -m pytest -q tests/gpu
want kernel_check && step "$BUILD_DIR/gpu/orthopt_kernel_check"
if want sanitizer; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
      # racecheck on the library's kernels only: with cuBLAS 13 (torch 2.11) it reports hazards
      # inside cuBLAS's own nvjet_sm90 kernels (TMA/mbarrier pipelines it does not model), which
      # are not ours to fix. memcheck checks
      # every kernel, cuBLAS's included (our pointers and sizes go into them).
      # racecheck itself dies at cuBLASLt's pointer-array products (the blocks path, orthopt_gemm;
      # "failed to handle a hardware exception"), so its
      # run leaves out the checks whose products run in cuBLAS (--library-kernels-only).
      only_ours=() ours_checks=()
      [ "$tool" = racecheck ] && { only_ours=(--kernel-name kns=orthopt_k); ours_checks=(--library-kernels-only); }
      if [ -z "${SANITIZER_SYM_PATHS:-}" ]; then
        step compute-sanitizer --tool "$tool" --error-exitcode 3 "${only_ours[@]}" \
          "$BUILD_DIR/gpu/orthopt_kernel_check" --quick "${ours_checks[@]}"
      else
        for path in $SANITIZER_SYM_PATHS; do
          step env KERNEL_CHECK_SYM_PATH="$path" compute-sanitizer --tool "$tool" --error-exitcode 3 "${only_ours[@]}" \
            "$BUILD_DIR/gpu/orthopt_kernel_check" --quick "${ours_checks[@]}"
        done
      fi
      # The one-pass momentum and NS input (a cooperative kernel) and the folded update's setup
      # kernel (their tests hold their references):
      # only the library's kernels (orthopt_k::) are checked, not ATen's in the fp64 reference.
      # Not *UpdateByProduct* under racecheck: racecheck 2025.3 fails on cuBLASLt's pointer-array
      # products themselves ("failed to handle a hardware exception", also with --kernel-name
      # matching no kernel at all), while memcheck, with every kernel
      # checked, is clean on them. The setup kernel has no shared memory, so no race to find.
      filter='*MomentumNsInput*:*UpdateByProduct*'
      [ "$tool" = racecheck ] && filter='*MomentumNsInput*'
      step compute-sanitizer --tool "$tool" --error-exitcode 3 --kernel-name kns=orthopt_k \
        "$BUILD_DIR/tests/gpu/test_gpu_fused" --gtest_filter="$filter"
    done
  else
    echo "!! compute-sanitizer not found"; status=1
  fi
fi
echo "GPU suite ($STEPS): $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
