#!/usr/bin/env bash
# Kernel work on the symmetric product in one short GPU run: configure with the lab, build only
# the kernel targets (orthopt_kernel_check, orthopt_sym_bench, lab_sym_designs), check the
# shipped paths against the fp64 reference (hang-guarded), time chosen shapes of the shipped
# paths, and optionally profile chosen kernels with Nsight Compute. Writes to $OUT (default
# build-gpu/out); prints a short summary last. From the repository root:
#   lab/probes/sym_profile.sh                      # check + time the default shapes
#   SHAPES="3 12" NCU_KERNELS="persistent nvjet lab:sym_wgmma_pingpong_kernel" lab/probes/sym_profile.sh
# SHAPES: indices into orthopt_sym_bench's shape list (0 = 1024², 2 = 4096², 3 = 8192²,
#   8 = 32×2048×7168, 12 = 88×2048², 13 = 66×2048×5632); NCU_SHAPE (default: the first of
#   SHAPES) is the one profiled. NCU_KERNELS: persistent (the shipped m64n256 kernel), nvjet
#   (cuBLAS's dense product, the peer), or lab:<regex> (a lab design's kernel, profiled in
#   lab_sym_designs at its shape LAB_NCU_SHAPE, default 1 = 4096²); regexes on mangled names
#   (ncu's demangled names carry no template arguments). SANITIZE=1 adds memcheck and racecheck.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${ORTHOPT_BUILD_DIR:-build-gpu}
OUT=${OUT:-$PWD/$B/out}
mkdir -p "$OUT"
SUMMARY=$OUT/sym_profile.txt
: > "$SUMMARY"
note() { echo "$*" >> "$SUMMARY"; }
t0=$(date +%s)

TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
PREFIX="$TORCH_PREFIX"
[ -d .gpudeps/usr ] && PREFIX="$PREFIX;$PWD/.gpudeps/usr"
PYBIND=$(python3 -m pybind11 --cmakedir 2>/dev/null || true)
rm -f "$B/CMakeCache.txt"  # a cache from another machine's paths would be reused otherwise
GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
if ! cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$(command -v python3)" \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DORTHOPT_LAB=ON "-DCMAKE_PREFIX_PATH=$PREFIX" ${PYBIND:+-Dpybind11_DIR=$PYBIND} > "$OUT/configure.log" 2>&1; then
  tail -20 "$OUT/configure.log"; exit 1
fi
if ! cmake --build "$B" -j "$(nproc)" --target orthopt_kernel_check orthopt_sym_bench lab_sym_designs > "$OUT/build.log" 2>&1; then
  grep -E "error" "$OUT/build.log" | head -20; exit 1
fi
note "build: $(( $(date +%s) - t0 )) s"

timeout 180 "$B/gpu/orthopt_kernel_check" --quick > "$OUT/kernel_check.txt" 2>&1
note "kernel_check rc=$?: $(grep -E 'kernel_check:' "$OUT/kernel_check.txt")"
grep -E '^FAIL' "$OUT/kernel_check.txt" | head -10 >> "$SUMMARY"
if ! grep -q 'kernel_check: passed' "$OUT/kernel_check.txt"; then cat "$SUMMARY"; exit 1; fi
if [ -n "${SANITIZE:-}" ]; then
  for tool in memcheck racecheck; do
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 3 "$B/gpu/orthopt_kernel_check" --quick \
      > "$OUT/sanitizer_$tool.txt" 2>&1
    note "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.txt" | tr '\n' ' ')"
  done
fi

SHAPES=${SHAPES:-2 3 8 12 13}
: > "$OUT/sym_shapes.md"
for i in $SHAPES; do
  SYM_BENCH_SHAPE=$i timeout 120 "$B/gpu/orthopt_sym_bench" "${REPEATS:-10}" > "$OUT/sym_bench_$i.md" 2>&1
  # The first shape's table header (the line after it is its separator), then each shape's row.
  [ -s "$OUT/sym_shapes.md" ] || grep -A1 -E '^\| batch×m×k \|' "$OUT/sym_bench_$i.md" >> "$OUT/sym_shapes.md"
  grep -E '^\| [0-9]+x[0-9]+x[0-9]+ \|' "$OUT/sym_bench_$i.md" >> "$OUT/sym_shapes.md"
done

if [ -n "${NCU_KERNELS:-}" ]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  shape=${NCU_SHAPE:-${SHAPES%% *}}
  metrics='gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  for name in $NCU_KERNELS; do
    tool=("$B/gpu/orthopt_sym_bench" 1); env=(SYM_BENCH_SHAPE=$shape)
    case $name in
      persistent) re='regex:sym_wgmma_coop_n256_kernel' ;;
      nvjet) re='regex:nvjet' ;;
      lab:*) re="regex:${name#lab:}"; tool=("$B/lab/lab_sym_designs" 1 --no-check); env=(LAB_SYM_SHAPE=${LAB_NCU_SHAPE:-1}) ;;
      *) re="regex:$name" ;;
    esac
    env "${env[@]}" timeout 180 "$NCU" --kernel-name-base mangled -k "$re" -c 1 --metrics "$metrics" \
      "${tool[@]}" > "$OUT/ncu_${name//[^A-Za-z0-9_]/_}.txt" 2>&1
    note "ncu $name (shape $shape) rc=$?:"
    grep -E '^\s+(gpu__|sm__|lts__|smsp__)' "$OUT/ncu_${name//[^A-Za-z0-9_]/_}.txt" | awk '{v=$NF; n=$1; sub("smsp__average_warps_issue_stalled_", "stall ", n); sub("_per_issue_active.ratio", "", n); if (n !~ /^stall/ || v+0 >= 0.1) printf "  %s %s\n", n, v}' >> "$SUMMARY"
  done
fi
note "total $(( $(date +%s) - t0 )) s"
cat "$OUT/sym_shapes.md"
cat "$SUMMARY"
