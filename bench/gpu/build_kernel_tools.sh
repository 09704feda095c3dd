#!/usr/bin/env bash
# Builds the kernel library's standalone tools for sm_90a on a machine without a GPU (nvcc only,
# no torch, no CMake): orthopt_kernel_check and orthopt_sym_bench in build-90a/ (git-ignored), so
# that a GPU call can carry them (the device tool's `carry: ["build-90a"]`) and spend its time
# running instead of compiling. The CUDA runtime is linked statically; cuBLAS/cuBLASLt 13 come
# from the GPU machine (/usr/local/cuda/lib64). The lab's tools: cmake -DORTHOPT_LAB=ON (lab/).
# From the repository root:   bench/gpu/build_kernel_tools.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
OUT=build-90a
mkdir -p "$OUT/obj"
FLAGS=(-O3 -DNDEBUG -std=c++17 -arch=sm_90a -Xcompiler=-fPIC -Ikernels/include)
SOURCES=(kernels/src/*.cu tests/gpu/kernel_check.cu bench/gpu/sym_bench.cu)
# One compile per core at a time.
printf '%s\n' "${SOURCES[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  '"$0" "$@" -c "{}" -o "'"$OUT"'/obj/$(basename "{}" .cu).o"' "$NVCC" "${FLAGS[@]}"
LIB=()
for f in kernels/src/*.cu; do LIB+=("$OUT/obj/$(basename "$f" .cu).o"); done
"$NVCC" -arch=sm_90a "${LIB[@]}" "$OUT/obj/kernel_check.o" -lcublas -lcublasLt -o "$OUT/orthopt_kernel_check"
"$NVCC" -arch=sm_90a "${LIB[@]}" "$OUT/obj/sym_bench.o" -lcublas -lcublasLt -o "$OUT/orthopt_sym_bench"
rm -rf "$OUT/obj"
echo "built $OUT/orthopt_kernel_check and $OUT/orthopt_sym_bench (sm_90a)"
