#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs orthopt's headline command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/build.sh
BUILD_DIR=${ORTHOPT_BUILD_DIR:-build}
exec "$BUILD_DIR/orthopt" bench ns "$@"
