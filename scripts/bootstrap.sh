#!/usr/bin/env bash
# Installs everything orthopt needs from Debian's archive when it is missing.
# Idempotent and fast when all is present (one dpkg query, no apt call).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build git
  libtorch-dev python3-torch python3-dev pybind11-dev
  libopenblas0-pthread          # without it Debian's torch uses the ~25x slower reference BLAS
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

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "bootstrap: done" >&2
