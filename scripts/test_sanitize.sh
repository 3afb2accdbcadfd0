#!/usr/bin/env bash
# Debug build with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only), then the cpu-labelled
# tests. Not part of CI's time budget by default; run before landing changes to stateful code
# (kv/, scheduler/, engine/, recipe/). Usage: bash scripts/test_sanitize.sh [ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
BUILD_DIR=build-asan BUILD_TYPE=Debug \
  CMAKE_ARGS="-DDI_CUDA=OFF -DDI_SANITIZE=address,undefined -DDI_BUILD_BENCH=OFF -DDI_BUILD_PYTHON=OFF" \
  scripts/build.sh
cd build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --output-on-failure -L cpu -j"$(nproc)" "$@"
