#!/usr/bin/env bash
# Installs everything orthopt needs from Debian's archive when it is missing.
# Idempotent and fast when all is present (one dpkg query, no apt call). Installs packages only:
# no system setting is changed (the BLAS the project uses is chosen by its own programs).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build git
  libtorch-dev python3-torch python3-dev pybind11-dev
  python3-pip python3-setuptools python3-wheel python3-venv   # pip install of the package
  libopenblas0-openmp           # without it Debian's torch uses the ~25x slower reference BLAS.
                                # The OpenMP build runs its products on torch's own OpenMP
                                # threads; the pthreads build (Debian's preferred alternative)
                                # keeps its workers spinning against them, 2.5x slower training on
                                # 2 cores (bench/results/2026-12-02-cpu-blas-threads.md). The
                                # project's executables load the OpenMP build first (DT_RPATH,
                                # CMakeLists.txt); scripts/blas_env.sh sets it up for Python.
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
