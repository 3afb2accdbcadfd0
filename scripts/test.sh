#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what CI runs). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc)" ${CTEST_ARGS:-}
