#!/bin/bash
# Whether this tree's NS input kernels (one-pass momentum + input, the two-pass norms) write the
# bits of an earlier tree's wherever no sum of squares overflows. On a GPU machine, from the
# repository root:   lab/probes/ns_input_bitcheck.sh [OLD]
# OLD: a commit before the overflow handling (default 648701b; needs git) or a directory holding
# that tree's kernels/. Prints BIT-IDENTICAL, or the configurations that differ.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NEW=$(cd "$HERE/../.." && pwd)
W=${BITCHECK_DIR:-/tmp/ns-input-bitcheck}
rm -rf "$W" && mkdir -p "$W/old"
OLD=${1:-648701b}
if [ -d "$OLD/kernels" ]; then cp -r "$OLD/kernels" "$W/old/"; else git -C "$NEW" archive "$OLD" kernels | tar -x -C "$W/old"; fi
FLAGS="-O3 -DNDEBUG -std=c++17 -arch=sm_90a"
build() {  # tree, out dir, extra flags
  mkdir -p "$2"
  for f in "$1"/kernels/src/*.cu; do
    nvcc $FLAGS -I "$1/kernels/include" -I "$1/kernels/src" -c "$f" -o "$2/$(basename "$f").o" &
  done
  wait
  nvcc $FLAGS $3 -I "$1/kernels/include" "$HERE/ns_input_bitcheck.cu" "$2"/*.o -lcublas -lcublasLt -o "$2/bitcheck"
}
build "$W/old" "$W/build-old" "-DPREV_NORMS_API" &
build "$NEW" "$W/build-new" "" &
wait
"$W/build-old/bitcheck" > "$W/old.txt"
"$W/build-new/bitcheck" > "$W/new.txt"
tail -1 "$W/new.txt"
if diff "$W/old.txt" "$W/new.txt" > "$W/diff.txt"; then echo BIT-IDENTICAL; else head -40 "$W/diff.txt"; exit 1; fi
