#!/usr/bin/env bash
# Configures and builds deepinfer into build/ (Release, warnings as errors). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
