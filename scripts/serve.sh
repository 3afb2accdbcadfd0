#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default model (models/deepinfer-demo-code).
# Until the HTTP server lands (issue #4) the main job is offline generation. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
exec build/bin/deepinfer generate --prompt "def fibonacci(n):" --max-tokens 48 "$@"
