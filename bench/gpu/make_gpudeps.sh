#!/usr/bin/env bash
# Builds .gpudeps/usr: the C++ dependencies the GPU machine's image lacks (fmt, nlohmann-json,
# CLI11, GoogleTest), copied from this machine's Debian packages (scripts/bootstrap.sh installs
# them). Carry it to the GPU machine (device tool: carry [".gpudeps"]); bench/gpu/run_all.sh puts
# it on CMAKE_PREFIX_PATH. fmt is used header-only there (no libfmt.so on that machine).
# Run from the repository root; also add "/.gpudeps/" to .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.gpudeps/usr
rm -rf .gpudeps
mkdir -p "$D/include" "$D/lib/cmake/fmt" "$D/lib/x86_64-linux-gnu/cmake" "$D/share/cmake"
cp -r /usr/include/fmt /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock "$D/include/"
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$D/share/cmake/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$D/lib/x86_64-linux-gnu/"
cat > "$D/lib/cmake/fmt/fmt-config.cmake" <<'CFG'
# Carried shim for the GPU machine: Debian's fmt headers used header-only (no libfmt.so there).
get_filename_component(_fmt_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fmt_prefix}/include"
                                            INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
endif()
set(fmt_FOUND TRUE)
CFG
printf 'set(PACKAGE_VERSION 9.1.0)\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n' > "$D/lib/cmake/fmt/fmt-config-version.cmake"
du -sh .gpudeps
