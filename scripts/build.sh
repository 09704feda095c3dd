#!/usr/bin/env bash
# Configures and builds orthopt into ./build (or $ORTHOPT_BUILD_DIR).
# Uses Debian's libtorch here; on a machine whose python3 has a CUDA torch, that one.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}

# Debian's torch belongs to /usr/bin/python3; elsewhere (GPU machine) the python3 on PATH.
PY=${ORTHOPT_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in /usr/bin/python3 python3; do
    if "$cand" -c 'import torch' 2>/dev/null; then PY=$(command -v "$cand"); break; fi
  done
fi
[ -n "$PY" ] || { echo "build: no python3 with torch found (run scripts/bootstrap.sh)" >&2; exit 1; }
TORCH_PREFIX=$("$PY" -c 'import torch, os; p=torch.utils.cmake_prefix_path; print(p if os.path.isdir(p) else "")')

GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=${ORTHOPT_BUILD_TYPE:-Release} \
    -DPython3_EXECUTABLE="$PY" ${TORCH_PREFIX:+-DCMAKE_PREFIX_PATH="$TORCH_PREFIX"} ${ORTHOPT_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "${ORTHOPT_JOBS:-$(nproc)}"
