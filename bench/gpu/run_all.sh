#!/usr/bin/env bash
# One GPU run: build against the machine's CUDA torch, run the GPU test suite, run the
# benchmarks, write logs and tables to $OUT (default build-gpu/out), print a short summary last.
# Usage, from the repository root:   bench/gpu/run_all.sh [build|pip|test|bench]...   (default: all)
# pip: the Python package alone (pip install --no-build-isolation . into a scratch target, then an
# import from another directory and one Muon step on the GPU).
# The C++ dependencies the GPU image lacks (fmt, nlohmann-json, CLI11, GoogleTest) are carried in
# .gpudeps/usr (bench/gpu/make_gpudeps.sh copies them from this machine's Debian packages); when
# that folder is present it comes first on CMAKE_PREFIX_PATH.
# Env: GPU_SUITE_ONLY=1 (skip the CPU ctest suite), SKIP_SANITIZER=1, SKIP_STEP=1,
#      WITH_ATEN_PRODUCTS=1 (also time NS with the kernels switched off),
#      DION_PATH=<folder holding the dion package> (also run bench/gpu/dion_peers.py).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/${ORTHOPT_BUILD_DIR:-build-gpu}/out}
mkdir -p "$OUT"
export ORTHOPT_BUILD_DIR=${ORTHOPT_BUILD_DIR:-build-gpu}
STEPS=${*:-build pip test bench}
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s)

note "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null)"
note "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1 | tail -1)"
note "nvcc: $(nvcc --version 2>/dev/null | tail -1); cmake: $(cmake --version | head -1); c++: $(c++ --version | head -1)"

if has build; then
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  PREFIX="$TORCH_PREFIX"
  [ -d .gpudeps/usr ] && PREFIX="$PREFIX;$PWD/.gpudeps/usr"
  PYBIND=$(python3 -m pybind11 --cmakedir 2>/dev/null || true)
  export ORTHOPT_PYTHON=$(command -v python3)
  export ORTHOPT_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PREFIX ${PYBIND:+-Dpybind11_DIR=$PYBIND}"
  tb=$(date +%s)
  # A configure that failed leaves a cache but no build files; scripts/build.sh would skip configuring.
  [ -f "$ORTHOPT_BUILD_DIR/CMakeCache.txt" ] && [ ! -f "$ORTHOPT_BUILD_DIR/build.ninja" ] && rm -f "$ORTHOPT_BUILD_DIR/CMakeCache.txt"
  if scripts/build.sh > "$OUT/build.log" 2>&1; then
    note "build: ok in $(( $(date +%s) - tb )) s ($(grep -m1 'CUDA in torch' "$OUT/build.log" | sed 's/.*orthopt: //'); $(grep -m1 'kernels built' "$OUT/build.log" | sed 's/.*orthopt: //'))"
  else
    note "build: FAILED after $(( $(date +%s) - tb )) s"; grep -E 'error|Error|CMake Error' "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"
    exit 1
  fi
fi

if has pip; then
  tp=$(date +%s)
  rm -rf /tmp/orthopt-pip
  if python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/orthopt-pip . > "$OUT/pip.log" 2>&1; then
    note "pip install: ok in $(( $(date +%s) - tp )) s"
    (cd /tmp && PYTHONPATH=/tmp/orthopt-pip python3 -c "
import torch, orthopt
p = torch.nn.Parameter(torch.randn(256, 512, device='cuda'))
p.grad = torch.randn_like(p)
w = p.detach().clone()
orthopt.Muon([p], lr=0.02).step()
torch.cuda.synchronize()
assert torch.isfinite(p).all() and not torch.equal(p, w)
print('pip package', orthopt.__version__, 'from', orthopt.__file__, ': one CUDA Muon step ok')
") 2>&1 | tail -2 | tee -a "$SUMMARY"
  else
    note "pip install: FAILED after $(( $(date +%s) - tp )) s"; tail -20 "$OUT/pip.log"
  fi
fi

if has test; then
  tt=$(date +%s)
  tests/gpu/run.sh > "$OUT/tests.log" 2>&1
  rc=$?
  note "GPU suite: rc=$rc in $(( $(date +%s) - tt )) s; ctest: $(grep -E 'tests passed|tests failed' "$OUT/tests.log" | head -1)"
  note "  pytest: $(grep -E '[0-9]+ (passed|failed|skipped)' "$OUT/tests.log" | tail -1)"
  note "  kernel_check: $(grep -c '^ok' "$OUT/tests.log") ok lines, $(grep -c '^FAIL' "$OUT/tests.log") FAIL lines"
  note "  sanitizer: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E '^FAIL|!! FAILED|rel err vs float64|PASSED|FAILED' "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
fi

if has bench; then
  timeout 300 "$ORTHOPT_BUILD_DIR/orthopt" bench ns --device cuda --methods standard,auto --warmup 3 --repeats 15 \
    --json "$OUT/bench_ns.json" > "$OUT/bench_ns.txt" 2>&1
  note "bench ns rc=$?"
  timeout 240 "$ORTHOPT_BUILD_DIR/gpu/orthopt_sym_bench" 20 > "$OUT/sym_bench.md" 2>&1
  note "sym_bench rc=$?"
  [ -n "${WITH_ATEN_PRODUCTS:-}" ] && timeout 200 "$ORTHOPT_BUILD_DIR/orthopt" bench ns --device cuda --methods standard,auto \
    --execution kernels=off --no-peer --warmup 3 --repeats 15 > "$OUT/bench_ns_aten.txt" 2>&1
  note "bench ns (ATen products, --execution kernels=off) rc=$?"
  for set in gpt2 llama; do
    for alg in muon dion3; do
      "$ORTHOPT_BUILD_DIR/orthopt" plan --set $set --device cuda --algorithm $alg > "$OUT/plan_${set}_${alg}.txt" 2>&1
    done
  done
  note "plans: $(ls "$OUT"/plan_*.txt | wc -l) written"
  [ -z "${SKIP_STEP:-}" ] && { timeout 150 "$ORTHOPT_BUILD_DIR/orthopt" bench step --device cuda --sets gpt2,llama --algorithms muon,normuon,dion3 --json "$OUT/bench_step.json"; echo "rc=$?"; timeout 90 python3 bench/gpu/step_peers.py gpt2 llama; echo "rc=$?"; } \
    > "$OUT/bench_step.txt" 2>&1
  note "bench step done"
  # The dion package as a same-run peer (a checkout of github.com/microsoft/dion; not part of the
  # tree): NS and steps round-robin in one process. Its first steps compile for minutes.
  if [ -n "${DION_PATH:-}" ]; then
    PYTHONPATH="$ORTHOPT_BUILD_DIR/python" timeout 600 python3 bench/gpu/dion_peers.py --dion "$DION_PATH" \
      > "$OUT/dion_peers.md" 2>&1
    note "dion peers rc=$?"
  fi
fi
note "total $(( $(date +%s) - t0 )) s"
echo "================ summary"
cat "$OUT/sym_bench.md" 2>/dev/null
grep -v '^peer:' "$OUT/bench_ns.txt" 2>/dev/null
grep -E 'auto|standard' "$OUT/bench_ns_aten.txt" 2>/dev/null | awk '{print "aten-products:", $1, $2, $3}'
cat "$OUT/bench_step.txt" 2>/dev/null
grep -E '^\|' "$OUT/dion_peers.md" 2>/dev/null
cat "$SUMMARY"
