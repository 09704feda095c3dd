#!/bin/bash
# Whether this tree's kernels write an earlier tree's bits, per operation and configuration. On a
# GPU machine, from the repository root:   lab/probes/bitcheck.sh PROBE [OLD]
#   multi_tensor: every flat multi-tensor operation and momentum_rows (OLD default 0cfd7e1, the
#                 C API before the tensor lists: built with -DOLD_API)
#   ns_input:     the NS input kernels, one-pass input and two-pass norms, wherever no sum of
#                 squares overflows (OLD default 648701b, norms without the input: -DPREV_NORMS_API)
# OLD: a commit (needs git) or a directory holding that tree's kernels/. Builds both kernel
# libraries, links PROBE_bitcheck.cu to each, diffs the hashes. Prints BIT-IDENTICAL, or the
# configurations that differ.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NEW=$(cd "$HERE/../.." && pwd)
PROBE=${1:?usage: bitcheck.sh multi_tensor|ns_input [OLD]}
case "$PROBE" in
  multi_tensor) OLD=${2:-0cfd7e1}; OLD_FLAGS=-DOLD_API ;;
  ns_input) OLD=${2:-648701b}; OLD_FLAGS=-DPREV_NORMS_API ;;
  *) echo "bitcheck.sh: unknown probe '$PROBE' (multi_tensor or ns_input)" >&2; exit 2 ;;
esac
W=${BITCHECK_DIR:-/tmp/bitcheck-$PROBE}
rm -rf "$W" && mkdir -p "$W/old"
if [ -d "$OLD/kernels" ]; then cp -r "$OLD/kernels" "$W/old/"; else git -C "$NEW" archive "$OLD" kernels | tar -x -C "$W/old"; fi
FLAGS="-O3 -DNDEBUG -std=c++17 -arch=sm_90a"
build() {  # tree, out dir, extra flags
  mkdir -p "$2"
  for f in "$1"/kernels/src/*.cu; do
    nvcc $FLAGS -I "$1/kernels/include" -I "$1/kernels/src" -c "$f" -o "$2/$(basename "$f").o" &
  done
  wait
  nvcc $FLAGS $3 -I "$1/kernels/include" "$HERE/${PROBE}_bitcheck.cu" "$2"/*.o -lcublas -lcublasLt -o "$2/bitcheck"
}
build "$W/old" "$W/build-old" "$OLD_FLAGS" &
build "$NEW" "$W/build-new" "" &
wait
"$W/build-old/bitcheck" > "$W/old.txt"
"$W/build-new/bitcheck" > "$W/new.txt"
tail -1 "$W/new.txt"
if diff "$W/old.txt" "$W/new.txt" > "$W/diff.txt"; then echo BIT-IDENTICAL; else head -40 "$W/diff.txt"; exit 1; fi
