#!/usr/bin/env bash
# The main job: installs what is missing, builds, and compares AdamW, Muon, NorMuon and Dion3 on
# the tiny byte-level transformer trained on the King James Bible (tables and plot in runs/compare).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}
# Threads: the CLI's policy (one per core less those other programs keep busy; ORTHOPT_NUM_THREADS
# overrides), on OpenBLAS's OpenMP build, which the orthopt executable loads (DT_RPATH) (docs/training.md).
exec "$BUILD_DIR/orthopt" compare "$@"
