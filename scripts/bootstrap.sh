#!/usr/bin/env bash
# Installs everything orthopt needs from Debian's archive when it is missing.
# Idempotent and fast when all is present (one dpkg query, no apt call).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build git
  libtorch-dev python3-torch python3-dev pybind11-dev
  libopenblas0-openmp           # without it Debian's torch uses the ~25x slower reference BLAS;
                                # the OpenMP build shares torch's OpenMP threads (see below)
  libgtest-dev libgmock-dev python3-pytest python3-numpy
  nlohmann-json3-dev libcli11-dev libfmt-dev libssl-dev   # libssl: SHA-256 of checkpoints
  libgloo-dev                   # headers of c10d::ProcessGroupGloo (distributed training)
  python3-matplotlib            # plots of orthopt compare
  bible-kjv bible-kjv-text      # default training corpus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "bootstrap: done" >&2
fi

# BLAS: OpenBLAS's OpenMP build, also where its pthreads build is installed (which Debian's
# alternatives prefer). With the pthreads build, OpenBLAS's own worker threads spin after each
# product while torch's OpenMP threads run the next operation on the same cores: on 2 cores an
# addmm with beta ran at 34 GFLOP/s instead of 233, and a 40-step `orthopt train` took 19.2 s
# instead of 7.5 (2026-12-02). The OpenMP build runs its products on torch's threads.
omp_dir=$(ls -d /usr/lib/*/openblas-openmp 2>/dev/null | head -1 || true)
if [ -n "$omp_dir" ]; then
  triplet=$(basename "$(dirname "$omp_dir")")
  for lib in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    name="$lib-$triplet"
    if [ "$(readlink "/etc/alternatives/$name")" != "$omp_dir/$lib" ]; then
      $SUDO update-alternatives --quiet --set "$name" "$omp_dir/$lib"
    fi
  done
fi
