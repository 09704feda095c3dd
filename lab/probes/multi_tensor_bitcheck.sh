#!/bin/bash
# Whether the multi-tensor kernels of this tree write the bits of those of an earlier one (the
# launcher rewrite: docs/decisions/multi-tensor-apply.md). On a GPU machine, from the repository
# root:   lab/probes/multi_tensor_bitcheck.sh [OLD]
# OLD: a commit with the previous C API (default 0cfd7e1; needs git) or a directory holding that
# tree's kernels/. Builds both kernel libraries, links multi_tensor_bitcheck.cu (-DOLD_API for the
# old one) to each, and diffs the hashes of every buffer each call writes over ~300 configurations.
# Prints BIT-IDENTICAL, or the configurations that differ.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NEW=$(cd "$HERE/../.." && pwd)
W=${BITCHECK_DIR:-/tmp/multi-tensor-bitcheck}
rm -rf "$W" && mkdir -p "$W/old"
OLD=${1:-0cfd7e1}
if [ -d "$OLD/kernels" ]; then cp -r "$OLD/kernels" "$W/old/"; else git -C "$NEW" archive "$OLD" kernels | tar -x -C "$W/old"; fi
FLAGS="-O3 -DNDEBUG -std=c++17 -arch=sm_90a"
build() {  # tree, out dir, extra flags
  mkdir -p "$2"
  for f in "$1"/kernels/src/*.cu; do
    nvcc $FLAGS -I "$1/kernels/include" -I "$1/kernels/src" -c "$f" -o "$2/$(basename "$f").o" &
  done
  wait
  nvcc $FLAGS $3 -I "$1/kernels/include" "$HERE/multi_tensor_bitcheck.cu" "$2"/*.o -lcublas -lcublasLt -o "$2/bitcheck"
}
build "$W/old" "$W/build-old" "-DOLD_API" &
build "$NEW" "$W/build-new" "" &
wait
"$W/build-old/bitcheck" > "$W/old.txt"
"$W/build-new/bitcheck" > "$W/new.txt"
echo "$(wc -l < "$W/new.txt") configurations"
if diff "$W/old.txt" "$W/new.txt" > "$W/diff.txt"; then echo BIT-IDENTICAL; else head -40 "$W/diff.txt"; exit 1; fi
