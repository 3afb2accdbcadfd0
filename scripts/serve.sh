#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default model (models/deepinfer-demo-code).
# Until the HTTP server lands (issue #4) the main job is offline generation. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
# "def fibonacci(n):" in the demo model's tokenizer, after BOS.
exec build/bin/deepinfer generate --prompt-ids 0,1354,223,19,3465,77,28,23 --max-tokens 48 --json "$@"
