#!/usr/bin/env bash
# The main job: installs what is missing, builds, and compares AdamW, Muon, NorMuon and Dion3 on
# the tiny byte-level transformer trained on the King James Bible (tables and plot in runs/compare).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}
# One torch thread per process is fastest for the tiny model on 2 cores (see docs/training.md).
export ORTHOPT_NUM_THREADS=${ORTHOPT_NUM_THREADS:-1}
exec "$BUILD_DIR/orthopt" compare "$@"
